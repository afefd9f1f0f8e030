"""Training-sized batches (issue 22): cost per item, other sessions' latency, start-up.

Against one `visenv serve` it starts itself (2 workers, frozenlake 4x4, PNG images):

- wall time per item of a batch create, a batch step (explicit actions) and a batch
  close of 64, 512 and 4,096 items, over REST and over gRPC (it should be flat: the cost
  linear in the items);
- while a 4,096-item batch create runs, a single-session probe (a step of one other
  session, one after another) measures its latency: p50, p99 and max, against the same
  probe on an idle server;
- the time from starting `visenv serve` to its printed address, its first answered
  request and (with `--startup-envs`, e.g. every env) every environment ready.

    python bench/bench_batches.py                         # about two minutes here
    python bench/bench_batches.py --sizes 64,512 --startup-envs sokoban,primitive_skill
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from env_server.testing.launcher import launch_server  # noqa: E402
from visenv.v1 import visenv_pb2 as pb  # noqa: E402
from visenv.v1 import visenv_pb2_grpc as pb_grpc  # noqa: E402

ENV = "frozenlake"


class Server:
    """`visenv serve` in its own process group; times of its start-up milestones."""

    def __init__(self, envs: str, workers: int, extra: list[str] = ()) -> None:
        self.started = time.monotonic()
        server = launch_server(workers=workers, envs=envs, idle_timeout=0, args=extra,
                               timeout=300, ready="banner")  # fmt: skip
        self.server, self.printed_at = server, server.banner_s
        self.url, self.grpc = server.url, server.grpc

    def first_answer(self) -> float:
        """Seconds from the start to the first answered /v1/envs (it waits for the workers)."""
        while True:
            try:
                if httpx.get(self.url + "/v1/envs", timeout=300).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                time.sleep(0.01)

    def all_ready(self, limit: float = 600) -> float | None:
        while time.monotonic() - self.started < limit:
            if httpx.get(self.url + "/health", timeout=30).json()["status"] == "ok":
                return time.monotonic() - self.started
            time.sleep(0.1)
        return None

    def stop(self) -> None:
        self.server.stop()


# ---- one transport's batch calls: (create, step, close) -> ids / None --------------------
class Rest:
    name = "REST"

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=600)

    def create(self, n: int) -> list[str]:
        items = [{"env": ENV, "seed": s} for s in range(n)]
        results = self.client.post("/v1/batch/create", json={"items": items}).json()["results"]
        assert all(r["ok"] for r in results), [r for r in results if not r["ok"]][:1]
        return [r["reply"]["session_id"] for r in results]

    def step(self, ids: list[str]) -> None:
        items = [{"session_id": i, "step_index": 0, "actions": [{"name": "Right"}]} for i in ids]
        results = self.client.post("/v1/batch/step", json={"items": items}).json()["results"]
        assert all(r["ok"] for r in results), [r for r in results if not r["ok"]][:1]

    def close(self, ids: list[str]) -> None:
        self.client.post("/v1/batch/close", json={"session_ids": ids}).raise_for_status()


class Grpc:
    name = "gRPC"

    def __init__(self, address: str) -> None:
        options = [("grpc.max_receive_message_length", 1 << 30)]
        self.channel = grpc.insecure_channel(address, options=options)
        self.stub = pb_grpc.VisenvStub(self.channel)

    def create(self, n: int) -> list[str]:
        items = [pb.SessionOptions(env=ENV, seed=s) for s in range(n)]
        results = self.stub.Create(pb.CreateRequest(items=items), timeout=600).results
        assert all(r.WhichOneof("result") == "reply" for r in results)
        return [r.reply.session_id for r in results]

    def step(self, ids: list[str]) -> None:
        items = []
        for sid in ids:
            item = pb.StepItem(session_id=sid, step_index=0)
            item.actions.actions.add(name="Right")
            items.append(item)
        results = self.stub.Step(pb.StepRequest(items=items), timeout=600).results
        assert all(r.WhichOneof("result") == "reply" for r in results)

    def close(self, ids: list[str]) -> None:
        self.stub.Close(pb.CloseRequest(session_ids=ids), timeout=600)


def timed(fn, *args):
    started = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - started


def per_item(transports, sizes: list[int]) -> None:
    print(f"\nwall time per item, {ENV} (ms/item; lower is better, flat is linear)")
    print(f"{'transport':9} {'items':>6} {'create':>8} {'step':>8} {'close':>8}")
    for size in sizes:
        for t in transports:  # alternating transports per size: both see the same load
            ids, c = timed(t.create, size)
            _, s = timed(t.step, ids)
            _, x = timed(t.close, ids)
            print(f"{t.name:9} {size:>6} {c / size * 1e3:>8.2f} {s / size * 1e3:>8.2f} "
                  f"{x / size * 1e3:>8.3f}", flush=True)  # fmt: skip


def probe_latency(url: str, rest: Rest, size: int, seconds_idle: float = 3.0) -> None:
    """Latency of one session's steps, alone and while a `size`-item batch create runs (a
    finished episode is reset between probes, untimed)."""
    client = httpx.Client(base_url=url, timeout=600)
    reply = client.post("/v1/sessions", json={"env": ENV, "config": {"max_turns": 1000}}).json()
    sid, index = reply["session_id"], 0

    def probe(stop: threading.Event, out: list[float]) -> None:
        nonlocal index
        while not stop.is_set():
            started = time.perf_counter()
            body = {"step_index": index, "actions": [{"name": ("Left", "Right")[index % 2]}]}
            r = client.post(f"/v1/sessions/{sid}/step", json=body)
            assert r.status_code == 200, r.text
            index += 1
            out.append(time.perf_counter() - started)
            if r.json()["terminated"] or r.json()["truncated"]:  # a new episode (not timed)
                client.post(f"/v1/sessions/{sid}/reset", json={}).raise_for_status()
                index = 0

    def run(during) -> list[float]:
        stop, out = threading.Event(), []
        thread = threading.Thread(target=probe, args=(stop, out))
        thread.start()
        result = during()
        stop.set()
        thread.join()
        return out, result

    idle, _ = run(lambda: time.sleep(seconds_idle))
    busy, (ids, took) = run(lambda: timed(rest.create, size))
    rest.close(ids)
    client.delete(f"/v1/sessions/{sid}")

    def q(xs: list[float], p: float) -> float:  # a fast create leaves one probe: its value
        return float(np.percentile(xs, p)) * 1e3

    print(f"\nsingle-session probe (REST step of one other {ENV} session), ms")
    print(f"{'while':28} {'n':>5} {'p50':>8} {'p99':>8} {'max':>8}")
    for label, xs in (("idle", idle), (f"a {size}-item create ({took:.1f} s)", busy)):
        print(f"{label:28} {len(xs):>5} {q(xs, 50):>8.1f} {q(xs, 99):>8.1f} "
              f"{max(xs) * 1e3:>8.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64,512,4096")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--startup-envs", default="",
                        help="also time a start-up serving these envs (comma-separated)")  # fmt: skip
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = Server(ENV, args.workers, ["--max-sessions", str(2 * max(sizes) + 16)])
    try:
        first = server.first_answer()
        print(f"start-up ({ENV}): address printed {server.printed_at:.2f} s, "
              f"first answer {first:.2f} s, all ready {server.all_ready():.2f} s")  # fmt: skip
        rest, grpc_ = Rest(server.url), Grpc(server.grpc)
        rest.close(rest.create(2 * args.workers))  # each worker's first env pays its imports
        per_item([rest, grpc_], sizes)
        probe_latency(server.url, rest, max(sizes))
    finally:
        server.stop()
    if args.startup_envs:
        server = Server(args.startup_envs, args.workers)
        try:
            first = server.first_answer()
            ready = server.all_ready()
            print(f"\nstart-up ({args.startup_envs}): address printed {server.printed_at:.2f} s, "
                  f"first answer {first:.2f} s, all ready "
                  f"{'never' if ready is None else f'{ready:.2f} s'}")  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    main()
