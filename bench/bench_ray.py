"""Env servers on a Ray cluster (issue 43, docs/ray.md): start-up, throughput, a kill and a
scale-down with drain, measured on a real multi-node cluster made on this machine.

It makes a `ray.cluster_utils.Cluster` (a head without CPUs and `--nodes` worker nodes of
`--cpus-per-node` CPUs each, torn down at the end) and drives a set through
env_server.ray.servers and the SDK's `ray://NAME`, as tests/ray does:

- time until servers answer: `up` of one server, to its /health "ok"; `scale` 1 -> 2, to
  the new one's "ok"; `up` of `--servers` servers at once, to all "ok";
- steps per second with one server and with two: `--sessions` sokoban sessions made
  through `ray://NAME` (placed by load), the whole batch stepped again and again for
  `--seconds` (session-steps per second; an episode that ends is reset);
- a kill: SIGKILL of one server's `visenv serve` process while a client holds sessions on
  both; the time until its sessions answer SESSION_LOST, until Ray's replacement answers
  /health "ok", and the longest call meanwhile;
- a scale-down with drain under load: episodes of `--turns` steps run on both servers
  (ended ones closed and replaced), `scale` 2 -> 1 drains one; sessions lost and calls
  failed until the drained server has stopped, and how long that took.

    python bench/bench_ray.py                    # about three minutes on 2 cores
    python bench/bench_ray.py --sessions 32 --seconds 20 --json ray.json

One server has `--cpus-per-server` Ray CPUs and as many worker processes. Ray's CPUs are a
budget, not cores: on a 2-core machine two servers, the client and Ray share two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

from clients import EnvClient, SessionOptions
from clients.errors import SessionLost, VisenvError
from env_server.ray import servers
from env_server.testing.ray_cluster import local_ray_cluster

MOVE = "<think>push the box</think><answer>Left, Up</answer>"


def until_ok(name: str, count: int, timeout: float = 300) -> list[dict[str, Any]]:
    """The set's server rows once `count` servers answer /health "ok"."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in servers.status(name) if r["kind"] == "server"]
        if sum(1 for r in rows if r.get("health") == "ok") >= count:
            return rows
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} servers of {name} never answered: {rows}")
        time.sleep(0.1)


def throughput(name: str, sessions: int, seconds: float) -> dict[str, Any]:
    with EnvClient(f"ray://{name}") as client:
        made = client.create([SessionOptions("sokoban", seed=s) for s in range(sessions)])
        ids = [r.session_id for r in made]
        per_server: dict[str, int] = {}
        for sid in ids:
            per_server[client.server_of(sid)] = per_server.get(client.server_of(sid), 0) + 1
        client.step(ids, [MOVE] * len(ids))  # warm
        steps, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            replies = client.step(ids, [MOVE] * len(ids))
            steps += len(ids)
            ended = [r.session_id for r in replies if r.terminated or r.truncated]
            if ended:
                client.reset(ended)
        took = time.monotonic() - started
    return {"sessions": sessions, "servers": len(per_server), "steps_per_s": steps / took}


def kill(name: str, sessions: int) -> dict[str, Any]:
    rows = until_ok(name, 2)
    victim = rows[0]
    with EnvClient(f"ray://{name}", refresh_s=1.0, timeout=30) as client:
        made = client.create([SessionOptions("sokoban", seed=s) for s in range(sessions)])
        ids = [r.session_id for r in made]
        doomed = {i for i in ids if client.server_of(i) == victim["grpc"]}
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        longest, lost_at, pending, wrong = 0.0, None, set(doomed), 0
        while lost_at is None:
            t = time.monotonic()
            results = client.step(ids, [MOVE] * len(ids), return_exceptions=True)
            longest = max(longest, time.monotonic() - t)
            for sid, result in zip(ids, results, strict=True):
                if isinstance(result, SessionLost) and sid in pending:
                    pending.discard(sid)
                elif isinstance(result, VisenvError):
                    wrong += 1  # another error, or a live server's session failing
            ids = [i for i in ids if i not in doomed or i in pending]  # lost: forgotten
            if not pending:
                lost_at = time.monotonic() - killed
            elif time.monotonic() - killed > 60:
                raise RuntimeError(f"sessions of the killed server still answer: {pending}")
        while True:  # new episodes go on meanwhile; the replacement answers
            t = time.monotonic()
            (reply,) = client.create(SessionOptions("sokoban", seed=1))
            client.step(reply.session_id, MOVE)
            client.close(reply.session_id)
            longest = max(longest, time.monotonic() - t)
            now = {r["index"]: r for r in servers.status(name) if r["kind"] == "server"}
            back = now.get(victim["index"], {})
            if back.get("health") == "ok" and back.get("pid") != victim["pid"]:
                replaced = time.monotonic() - killed
                break
            time.sleep(0.1)
    return {
        "sessions_on_killed": len(doomed),
        "other_errors": wrong,
        "session_lost_after_s": lost_at,
        "replacement_ok_after_s": replaced,
        "replacement_serve_start_s": back.get("serve_start_s"),
        "longest_call_s": longest,
    }


def drain(name: str, sessions: int, turns: int) -> dict[str, Any]:
    until_ok(name, 2)
    lost = failed = calls = 0
    longest = 0.0
    with EnvClient(f"ray://{name}", refresh_s=1.0, timeout=30) as client:
        age: dict[str, int] = {}

        def top_up() -> None:
            nonlocal failed, calls
            want = sessions - len(age)
            if want > 0:
                calls += 1
                for r in client.create(
                    [SessionOptions("sokoban", seed=s) for s in range(want)],
                    return_exceptions=True,
                ):
                    if isinstance(r, VisenvError):
                        failed += 1
                    else:
                        age[r.session_id] = 0

        top_up()
        on = {r["grpc"]: r["index"] for r in servers.status(name) if r["kind"] == "server"}
        started, scaled, gone, held = time.monotonic(), None, None, 0
        while gone is None and time.monotonic() - started < 120:
            if scaled is None and time.monotonic() - started > 2:
                (drained,) = servers.scale(name, 1)["drained"]
                scaled = time.monotonic()
                held = sum(1 for s in age if on.get(client.server_of(s)) == drained)
            ids = list(age)
            t = time.monotonic()
            results = client.step(ids, [MOVE] * len(ids), return_exceptions=True)
            longest = max(longest, time.monotonic() - t)
            calls += 1
            done = []
            for sid, r in zip(ids, results, strict=True):
                if isinstance(r, SessionLost):
                    lost += 1
                    done.append(sid)
                elif isinstance(r, VisenvError):
                    failed += 1
                    done.append(sid)
                else:
                    age[sid] += 1
                    if r.terminated or r.truncated or age[sid] >= turns:
                        done.append(sid)
            if done:
                calls += 1
                failed += sum(1 for e in client.close(done) if e is not None)
                for sid in done:
                    age.pop(sid, None)
            top_up()
            if scaled is not None and drained not in servers.members(name, "server"):
                gone = time.monotonic() - scaled
        left = {on.get(client.server_of(s)) for s in client.session_ids}
    return {
        "sessions": sessions,
        "turns_per_episode": turns,
        "sessions_on_drained_server_at_scale": held,
        "sessions_lost": lost,
        "calls_failed": failed,
        "calls": calls,
        "drained_server_stopped_after_s": gone,
        "new_sessions_only_on": sorted(i for i in left if i is not None),
        "longest_call_s": longest,
    }


def run_all(args: argparse.Namespace, spec, out: dict[str, Any]) -> None:
    """Every measurement, on the cluster this process is connected to; sets torn down after."""
    try:
        t = time.monotonic()
        servers.up(spec("bench"), 1)
        out["up_1_answers_s"] = time.monotonic() - t
        until_ok("bench", 1)
        out["up_1_ok_s"] = time.monotonic() - t
        out["one_server"] = throughput("bench", args.sessions, args.seconds)
        t = time.monotonic()
        servers.scale("bench", 2)
        until_ok("bench", 2)
        out["scale_1_to_2_ok_s"] = time.monotonic() - t
        out["two_servers"] = throughput("bench", args.sessions, args.seconds)
        out["kill"] = kill("bench", 8)
        out["drain"] = drain("bench", args.sessions, args.turns)
        servers.down("bench")
        t = time.monotonic()
        servers.up(spec("cold"), args.servers)
        out[f"up_{args.servers}_answers_s"] = time.monotonic() - t
        until_ok("cold", args.servers)
        out[f"up_{args.servers}_ok_s"] = time.monotonic() - t
        servers.down("cold")
    finally:
        for name in ("bench", "cold"):
            try:
                servers.down(name)
            except servers.SetError:
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=2)
    parser.add_argument("--cpus-per-server", type=int, default=1)
    parser.add_argument("--servers", type=int, default=2, help="for the cold start of a set")
    parser.add_argument("--envs", default="sokoban,frozenlake")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()

    def spec(name: str) -> servers.SetSpec:
        return servers.SetSpec(name, cpus_per_server=args.cpus_per_server, envs=args.envs)

    out: dict[str, Any] = {"args": vars(args), "load_average_at_start": os.getloadavg()}
    t = time.monotonic()
    with local_ray_cluster(args.nodes, args.cpus_per_node):
        out["cluster_start_s"] = time.monotonic() - t
        run_all(args, spec, out)
    out["load_average_at_end"] = os.getloadavg()  # other work on the machine meanwhile
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
