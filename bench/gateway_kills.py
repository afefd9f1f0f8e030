"""Gateway kills: do sessions survive gateways being SIGKILLed under load? And what
does a step through a gateway cost over a direct call?

Starts two upstream servers (nodes light-0 and light-1, the test-only `tiny` corridor,
one worker each) and two gateways in front of both, creates `--sessions` sessions, and
steps them all, over and over, from `--concurrency` client tasks over REST, each
session preferring one of the gateways. Meanwhile a gateway is SIGKILLed and
restarted `--kills` times (alternately A and B). A client whose step gets no answer
(connection refused or cut) or UNAVAILABLE retries the same step, with the same
step_index, through the other gateway: that is the whole client-side recovery.

At the end each session's own upstream is asked (directly, not through a gateway) how
many turns it applied: fewer than the client had acknowledged is a lost step, more is a
step applied twice. Both must be 0.

Then the latency of one step: one session stepped sequentially straight on its upstream
and one through a gateway, over REST (httpx, keep-alive) and gRPC (the SDK), in
alternating blocks; the extra p50 of the gateway is its cost.

    python bench/gateway_kills.py                        # 1,000 sessions, 10 kills
    python bench/gateway_kills.py --sessions 200 --kills 4 --latency-steps 100
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clients import EnvClient, SessionOptions  # noqa: E402
from env_server.testing.launcher import VisenvServer, launch_servers  # noqa: E402

OPTIONS = {"env": "tiny", "format": "no_think", "config": {"length": 32, "max_turns": 1000}}
MOVES = ("<answer>Left</answer>", "<answer>Right</answer>")


def gateway_config(upstreams: list[VisenvServer]) -> dict:
    return {"envs": None, "upstreams": [u.grpc for u in upstreams]}


class Run:
    def __init__(self, upstreams: list[VisenvServer], gateways: list[VisenvServer]) -> None:
        self.upstreams = upstreams
        self.gateways = gateways
        self.acked: dict[str, int] = {}  # session id -> steps answered 200 (applied)
        self.counts: Counter[str] = Counter()
        self.stop = asyncio.Event()

    def url(self, which: int) -> str:
        return self.gateways[which].url

    async def step_once(self, http: httpx.AsyncClient, sid: str, prefer: int) -> None:
        index = self.acked[sid]
        body = {"step_index": index, "response": MOVES[index % 2]}
        which = prefer
        for _ in range(600):
            try:
                r = await http.post(f"{self.url(which)}/v1/sessions/{sid}/step", json=body)
            except httpx.ConnectError:  # the gateway is down: nothing was sent
                r = None
            except httpx.TransportError:  # cut mid-request: the step may have been applied
                self.counts["steps cut in flight"] += 1
                r = None
            if r is not None and r.status_code == 200:
                if r.json()["turn"] != index + 1:
                    self.counts["wrong turn in a reply"] += 1
                self.acked[sid] = index + 1
                self.counts["steps"] += 1
                return
            if r is not None and r.status_code != 503:
                self.counts[f"error {r.status_code} {r.json()['error']['code']}"] += 1
                return
            self.counts["retries"] += 1
            which = 1 - which  # the other gateway
            await asyncio.sleep(0.02)
        self.counts["gave up"] += 1

    async def client(self, sids: list[str]) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while not self.stop.is_set():
                for n, sid in enumerate(sids):
                    await self.step_once(http, sid, n % 2)

    async def killer(self, kills: int, interval: float) -> None:
        for k in range(kills):
            await asyncio.sleep(interval)
            which = k % 2
            self.gateways[which].kill()
            t0 = time.monotonic()
            (self.gateways[which],) = await asyncio.to_thread(
                launch_servers, gateway_config(self.upstreams)
            )
            self.counts["kills"] += 1
            print(f"  kill {k + 1}: gateway {'AB'[which]} back in {time.monotonic() - t0:.1f} s")
        await asyncio.sleep(interval)
        self.stop.set()


async def kill_run(args, upstreams, gateways) -> dict:
    run = Run(upstreams, gateways)
    async with httpx.AsyncClient(timeout=120) as http:
        for start in range(0, args.sessions, 250):
            items = [
                {**OPTIONS, "seed": 1000 + s} for s in range(start, min(start + 250, args.sessions))
            ]
            made = await http.post(f"{run.url(0)}/v1/batch/create", json={"items": items})
            for result in made.json()["results"]:
                if not result["ok"]:
                    raise SystemExit(f"creating sessions failed: {result['error']}")
                run.acked[result["reply"]["session_id"]] = 0
    sids = list(run.acked)
    print(f"{len(sids)} sessions on {Counter(s.split('.')[1] for s in sids)}")
    t0 = time.monotonic()
    chunks = [sids[i :: args.concurrency] for i in range(min(args.concurrency, len(sids)))]
    await asyncio.gather(run.killer(args.kills, args.interval), *(run.client(c) for c in chunks))
    seconds = time.monotonic() - t0
    # each session's own upstream tells how many turns it applied
    lost = doubled = 0
    nodes = {}
    for u in upstreams:
        nodes[httpx.get(u.url + "/health").json()["node"]] = u
    async with httpx.AsyncClient(timeout=60) as http:
        for sid in sids:
            got = (await http.get(f"{nodes[sid.split('.')[1]].url}/v1/sessions/{sid}")).json()
            lost += max(0, run.acked[sid] - got["turn"])
            doubled += max(0, got["turn"] - run.acked[sid])
    return {"seconds": round(seconds, 1), "lost": lost, "doubled": doubled, **run.counts}


def rest_latency(url: str, sid: str, steps: int, first: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for i in range(first, first + steps):
            t = time.perf_counter()
            r = http.post(
                f"/v1/sessions/{sid}/step", json={"step_index": i, "response": MOVES[i % 2]}
            )
            out.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
    return out


def grpc_latency(address: str, steps: int) -> list[float]:
    out = []
    with EnvClient(address) as client:
        (reply,) = client.create(SessionOptions(**{**OPTIONS, "seed": 5}))
        sid = reply.session_id
        for i in range(steps):
            t = time.perf_counter()
            client.step([sid], [MOVES[i % 2]])
            out.append(time.perf_counter() - t)
    return out


def latency(args, upstreams: list[VisenvServer], gateway: VisenvServer) -> dict:
    """p50/p90 of a step, direct vs through the gateway, in alternating blocks (the
    direct session on the upstream that holds the gateway's session)."""
    samples: dict[str, list[float]] = {k: [] for k in ("rest direct", "rest gateway")}
    samples.update({"grpc direct": [], "grpc gateway": []})
    with httpx.Client(timeout=30) as http:
        via = http.post(f"{gateway.url}/v1/sessions", json={**OPTIONS, "seed": 7}).json()
        node = via["session_id"].split(".")[1]
        (upstream,) = [u for u in upstreams if http.get(u.url + "/health").json()["node"] == node]
        direct = http.post(f"{upstream.url}/v1/sessions", json={**OPTIONS, "seed": 7}).json()
    sids = {"rest direct": direct["session_id"], "rest gateway": via["session_id"]}
    done = 0
    block = max(1, args.latency_steps // 4)
    for _ in range(4):  # direct, gateway, direct, gateway, ...
        for name, url in (("rest direct", upstream.url), ("rest gateway", gateway.url)):
            samples[name] += rest_latency(url, sids[name], block, done)
        for name, addr in (("grpc direct", upstream.grpc), ("grpc gateway", gateway.grpc)):
            samples[name] += grpc_latency(addr, block)
        done += block

    def q(xs: list[float], p: float) -> float:
        return round(statistics.quantiles(xs, n=100)[int(p) - 1] * 1000, 2)

    table = {k: {"p50_ms": q(v, 50), "p90_ms": q(v, 90), "n": len(v)} for k, v in samples.items()}
    for t in ("rest", "grpc"):
        table[f"{t} extra p50 ms"] = round(
            table[f"{t} gateway"]["p50_ms"] - table[f"{t} direct"]["p50_ms"], 2
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between kills")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency-steps", type=int, default=400)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers (finally) on a kill
    upstreams = launch_servers(
        *[
            {"workers": 1, "envs": "tiny", "extra_env": {"VISENV_NODE_ID": f"light-{i}"}}
            for i in range(2)
        ]
    )
    gateways = launch_servers(*[gateway_config(upstreams)] * 2)
    try:
        result = asyncio.run(kill_run(args, upstreams, gateways))
        print("kills:", result)
        print("latency:", latency(args, upstreams, gateways[0]))
    finally:
        for server in [*gateways, *upstreams]:
            server.stop()


if __name__ == "__main__":
    main()
