"""Soak: many concurrent sessions, random clients, worker kills, lossy connections; audited.

A real `visenv serve` (2 workers) holds --sessions Sokoban and FrozenLake sessions plus
--heavy sessions of each heavy environment (navigation, primitive_skill, svg). Clients,
some through a lossy proxy (tests/clients/lossy_proxy.py: a reply is dropped and the
connection cut, so the SDK retries the same step_index), visit their sessions round-robin
and pick an op at random (step 75%, get 10%, reset 8%, close and re-create 4%, nothing 3%);
batch clients send one call per op for a chunk of sessions, single clients one call per
session (the coalesced path), over gRPC and REST. A worker is SIGKILLed every
--kill-every s; its sessions answer SESSION_LOST and the clients re-create them. A prober
fills the server to its cap now and then (it must answer CAPACITY, never exceed the cap);
--abandon sessions are made and never touched again (the idle reaper must close them).

The audit, from the clients' records and the server's (/metrics, /health, process RSS):
  - every reply is for the session asked about (id and env), and its step_index is the
    one the client sent + 1 (a step applied twice or skipped would break it);
  - every failed step is SESSION_LOST (a killed worker), nothing else;
  - steps applied by the server (visenv_steps_total) = steps acknowledged to clients,
    give or take the steps whose reply was lost and then its session (bounded);
  - sessions never above the cap; CAPACITY answered; abandoned sessions reaped;
  - server RSS (API process + workers) at the end within 10% of minute 2 (sampled just
    before each kill, when every session has been re-created).

    python bench/soak.py --minutes 10            # the full soak (10,000 sessions)
    python bench/soak.py --minutes 0.5 --sessions 400 --heavy 0 --kill-every 10 \
        --idle-timeout 5 --abandon 10            # the short version (tests/service/test_soak.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clients import AsyncEnvClient, SessionOptions  # noqa: E402
from env_server.testing.launcher import launch_server  # noqa: E402
from tests.clients.lossy_proxy import LossyProxy  # noqa: E402

LIGHT = ("sokoban", "frozenlake")
HEAVY = ("navigation", "primitive_skill", "svg")
ANSWERS = {
    "sokoban": ("Left", "Right", "Up", "Down", "Left, Up", "Down, Right"),
    "frozenlake": ("Left", "Right", "Up", "Down", "Right, Down"),
    "navigation": ("moveahead", "rotateleft", "rotateright, moveahead"),
    "primitive_skill": ("pick(100, 0, 20)", "push(0, 0, 20, 50, 0, 20)"),
    "svg": (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64">'
        '<circle cx="32" cy="32" r="20" fill="red"/></svg>',
    ),  # fmt: skip
}


def text(env: str, rng: random.Random) -> str:
    return f"<think>soak</think><answer>{rng.choice(ANSWERS[env])}</answer>"


@dataclass
class Slot:
    env: str
    sid: str | None = None
    done: bool = False
    seed: int = 0


@dataclass
class Audit:
    ops: Counter = field(default_factory=Counter)  # (op, outcome) -> count
    acked_steps: int = 0
    mismatched: int = 0  # a reply for another session/env, or an unexpected step_index
    examples: list[str] = field(default_factory=list)
    lost_steps: int = 0  # steps answered SESSION_LOST
    other_step_errors: int = 0  # steps that failed any other way (must be 0)
    reaped_in_use: int = 0  # steps on a session the reaper had closed (idle too long)
    forgotten: int = 0  # sessions the SDK had dropped (after an error) before our next op
    client_errors: int = 0  # exceptions in the soak's own client code (must be 0)
    lossy_failures: int = 0  # steps on lossy clients that failed after a lost reply
    replies_dropped: int = 0  # replies the proxies dropped on purpose
    capacity_answers: int = 0
    kills: int = 0
    max_sessions_seen: int = 0
    rss: list[tuple[float, float, int]] = field(default_factory=list)  # (t, MiB, sessions)
    rss_before_kill: list[tuple[float, float]] = field(default_factory=list)

    def note(self, message: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(message)


class Server:
    def __init__(self, args: argparse.Namespace, cap: int) -> None:
        envs = ",".join(LIGHT + (HEAVY if args.heavy else ()))
        server = launch_server(workers=args.workers, envs=envs, max_sessions=cap,
                               idle_timeout=args.idle_timeout, timeout=600, ready="banner",
                               inherit_env=True)  # fmt: skip
        self.proc, self.lines = server.proc, server.output
        self.http, self.grpc = server.http, server.grpc
        self.ps = psutil.Process(self.proc.pid)

    def health(self) -> dict:
        return httpx.get(f"http://{self.http}/health", timeout=60).json()

    def metric(self, name: str) -> float:
        body = httpx.get(f"http://{self.http}/metrics", timeout=60).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                   if line.startswith(name) and not line.startswith("#"))  # fmt: skip

    def rss_mib(self) -> float:
        total = 0
        for p in [self.ps, *self.ps.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total / 2**20

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


class Owner:
    """One client (its own connection, maybe through a lossy proxy) and its sessions."""

    def __init__(self, name: str, slots: list[Slot], address: str, transport: str,
                 proxy: LossyProxy | None, batch: bool, args: argparse.Namespace,
                 audit: Audit, rng: random.Random) -> None:  # fmt: skip
        self.name, self.slots, self.batch, self.args = name, slots, batch, args
        self.proxy, self.audit, self.rng = proxy, audit, rng
        address = proxy.address if proxy is not None else address
        self.client = AsyncEnvClient(address, transport=transport, timeout=300, retries=5)
        self.armed = False  # a reply of ours is to be dropped (lossy clients)

    def options(self, slot: Slot) -> SessionOptions:
        slot.seed = self.rng.randrange(10**6)
        return SessionOptions(slot.env, seed=slot.seed, format="free_think")

    def record(self, op: str, result: object) -> str:
        outcome = "ok" if not isinstance(result, Exception) else (
            getattr(result, "code", None) or type(result).__name__)  # fmt: skip
        self.audit.ops[(op, outcome)] += 1
        return outcome

    def check(self, op: str, slot: Slot, reply, expected_index: int) -> None:
        if reply.session_id != slot.sid or reply.env != slot.env:
            self.audit.mismatched += 1
            self.audit.note(
                f"{op}: asked {slot.sid}/{slot.env}, got {reply.session_id}/{reply.env}"
            )
        elif reply.step_index != expected_index:
            self.audit.mismatched += 1
            self.audit.note(
                f"{op} {slot.sid}: step_index {reply.step_index}, expected {expected_index}"
            )

    def failed(self, slot: Slot, outcome: str) -> None:
        if outcome in ("SESSION_LOST", "NOT_FOUND"):
            slot.sid = None  # gone (killed worker, reaped): made again on the next visit

    async def create(self, slots: list[Slot]) -> None:
        for start in range(0, len(slots), 100):  # replies of 100 sessions: well under 4 MB
            await self._create(slots[start : start + 100])

    async def _create(self, slots: list[Slot]) -> None:
        results = await self._per_item_errors(self.client.create([self.options(s) for s in slots],
                                                       return_exceptions=True), len(slots))  # fmt: skip
        for slot, r in zip(slots, results, strict=True):
            outcome = self.record("create", r)
            if outcome == "ok":
                slot.sid, slot.done = r.session_id, r.done
                if r.env != slot.env or r.step_index != 0:
                    self.audit.mismatched += 1
                    self.audit.note(f"create {slot.env}: got {r.env} step_index {r.step_index}")
            elif outcome == "CAPACITY":
                self.audit.capacity_answers += 1

    async def _per_item_errors(self, call, n: int) -> list:
        """A whole call that failed (connection gone after every retry): each item's error."""
        try:
            return await call
        except Exception as exc:  # noqa: BLE001  (recorded per item by the caller)
            return [exc] * n

    def arm(self) -> None:
        if self.proxy is not None and self.rng.random() < self.args.lose_rate:
            self.proxy.lose_next_reply()
            self.audit.replies_dropped += 1
            self.armed = True

    async def do(self, op: str, slots: list[Slot]) -> None:
        known = set(self.client.session_ids)
        for slot in slots:
            if slot.sid not in known:  # the client dropped it (e.g. lost): make it again
                self.audit.forgotten += 1
                slot.sid = None
        slots = [s for s in slots if s.sid is not None]
        if not slots:
            return
        self.arm()
        ids = [s.sid for s in slots]
        if op == "step":
            sent = [self.client.next_step_index(i) for i in ids]
            texts = [text(s.env, self.rng) for s in slots]
            results = await self._per_item_errors(self.client.step(ids, texts, return_exceptions=True),
                                        len(slots))  # fmt: skip
        elif op == "reset":
            sent = [-1] * len(slots)
            results = await self._per_item_errors(self.client.reset(ids, [self.rng.randrange(10**6)
                                        for _ in ids], return_exceptions=True), len(slots))  # fmt: skip
        elif op == "get":
            sent = [self.client.next_step_index(i) - 1 for i in ids]
            results = await self._per_item_errors(
                self.client.get(ids, return_exceptions=True), len(slots)
            )
        else:  # close: the client forgets the session whatever the answer
            results = await self._per_item_errors(self.client.close(ids), len(slots))
            for slot, r in zip(slots, results, strict=True):
                self.record("close", r)
                slot.sid = None
            return
        lossy, self.armed = self.armed, False
        for slot, index, r in zip(slots, sent, results, strict=True):
            outcome = self.record(op, r)
            if outcome != "ok":
                if op == "step":
                    if outcome == "SESSION_LOST":
                        self.audit.lost_steps += 1
                    elif outcome == "NOT_FOUND" and "idle" in str(r):
                        self.audit.reaped_in_use += 1  # idle past the timeout: refused, clearly
                    else:
                        self.audit.other_step_errors += 1
                        self.audit.note(f"step {slot.sid} ({self.name}): {outcome}: {r}")
                    self.audit.lossy_failures += lossy
                self.failed(slot, outcome)
                continue
            self.check(op, slot, r, index + 1)
            slot.done = r.done
            if op == "step":
                self.audit.acked_steps += 1

    def plan(self, slot: Slot) -> str:
        if slot.sid is None:
            return "create"
        x = self.rng.random()
        op = ("step" if x < 0.75 else "get" if x < 0.85 else "reset" if x < 0.93
              else "close" if x < 0.97 else "idle")  # fmt: skip
        if op == "step" and slot.done:
            op = "reset"
        return op

    async def run(self, deadline: float) -> None:
        chunk = self.args.chunk if self.batch else 1
        pos = 0
        try:
            while time.monotonic() < deadline:
                group = [self.slots[(pos + k) % len(self.slots)] for k in range(chunk)]
                pos = (pos + chunk) % len(self.slots)
                by_op: dict[str, list[Slot]] = {}
                for n, slot in enumerate(group):
                    if all(slot is not other for other in group[:n]):  # once per group
                        by_op.setdefault(self.plan(slot), []).append(slot)
                try:
                    if "create" in by_op:
                        await self.create(by_op.pop("create"))
                    for op in ("step", "reset", "get", "close"):
                        await self.do(op, by_op.get(op, []))
                except Exception as exc:  # noqa: BLE001  (a bug of this script: counted, shown)
                    self.audit.client_errors += 1
                    self.audit.note(f"{self.name}: {type(exc).__name__}: {exc}")
                    for slot in group:
                        slot.sid = None
                if not self.batch:
                    await asyncio.sleep(0)
        finally:
            await self.client.aclose(close_sessions=False)


async def monitor(server: Server, audit: Audit, args: argparse.Namespace, t0: float,
                  deadline: float, cap: int) -> None:  # fmt: skip
    """Every 5 s: sessions (never above the cap) and RSS; every --kill-every s: kill a
    worker (RSS sampled just before); every 45 s: fill the server to its cap and beyond."""
    next_kill = t0 + args.kill_every
    next_probe = t0 + min(45.0, args.kill_every * 0.6)
    victim = 0
    async with AsyncEnvClient(server.grpc, timeout=300) as prober:
        while time.monotonic() < deadline:
            await asyncio.sleep(min(5.0, args.kill_every / 4))
            health = await asyncio.to_thread(server.health)
            now = time.monotonic()
            audit.max_sessions_seen = max(audit.max_sessions_seen, health["sessions"])
            rss = await asyncio.to_thread(server.rss_mib)
            audit.rss.append((now - t0, rss, health["sessions"]))
            if now >= next_kill and now < deadline - 2:
                audit.rss_before_kill.append((now - t0, rss))
                alive = [w for w in health["workers"] if w["alive"] and w["pid"]]
                if alive:
                    worker = alive[victim % len(alive)]
                    victim += 1
                    os.kill(worker["pid"], signal.SIGKILL)
                    audit.kills += 1
                next_kill += args.kill_every
            if now >= next_probe:
                next_probe += 45.0
                room = cap - health["sessions"]
                made = await prober.create([SessionOptions("sokoban", seed=s) for s in
                                            range(max(room, 0) + 20)], return_exceptions=True)  # fmt: skip
                codes = Counter(getattr(r, "code", "ok") for r in made)
                audit.ops[("cap-probe", "CAPACITY")] += codes["CAPACITY"]
                audit.capacity_answers += codes["CAPACITY"]
                ids = [r.session_id for r in made if not isinstance(r, Exception)]
                if ids:
                    await prober.close(ids)


async def soak(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    heavy_total = len(HEAVY) * args.heavy
    cap = args.sessions + heavy_total + args.abandon + 64
    server = Server(args, cap)
    audit = Audit()
    proxies: list[LossyProxy] = []
    try:
        n_single = args.single_clients
        light = [Slot(LIGHT[i % 2]) for i in range(args.sessions)]
        singles, batched = (
            light[: n_single * args.single_slots],
            light[n_single * args.single_slots :],
        )
        owners: list[Owner] = []
        for i in range(n_single):
            lossy = i < n_single * args.lossy
            transport = "http" if i % 2 else "grpc"
            proxy = (
                LossyProxy(server.http if transport == "http" else server.grpc) if lossy else None
            )
            proxies += [proxy] if proxy else []
            owners.append(Owner(f"single-{i}", singles[i * args.single_slots:(i + 1) * args.single_slots],
                                server.http if transport == "http" else server.grpc, transport,
                                proxy, False, args, audit, random.Random(rng.random())))  # fmt: skip
        per = max(1, -(-len(batched) // args.batch_clients))
        for i in range(args.batch_clients):
            lossy = i < args.batch_clients * args.lossy
            proxy = LossyProxy(server.grpc) if lossy else None
            proxies += [proxy] if proxy else []
            owners.append(Owner(f"batch-{i}", batched[i * per:(i + 1) * per], server.grpc, "grpc",
                                proxy, True, args, audit, random.Random(rng.random())))  # fmt: skip
        if heavy_total:
            heavy = [Slot(env) for env in HEAVY for _ in range(args.heavy)]
            owners.append(Owner("heavy", heavy, server.grpc, "grpc", None, False, args, audit,
                                random.Random(rng.random())))  # fmt: skip
        owners = [o for o in owners if o.slots]
        # the population first (batched creates), then the abandoned sessions
        t_fill = time.monotonic()
        await asyncio.gather(*(o.create([s for s in o.slots if s.env in LIGHT]) for o in owners))
        fill_s = time.monotonic() - t_fill
        async with AsyncEnvClient(server.grpc, timeout=300) as client:
            abandoned = [r.session_id for r in await client.create(
                [SessionOptions("frozenlake", seed=s) for s in range(args.abandon)])]  # fmt: skip
            t0 = time.monotonic()
            deadline = t0 + args.minutes * 60
            steps0 = await asyncio.to_thread(server.metric, "visenv_steps_total")
            await asyncio.gather(monitor(server, audit, args, t0, deadline, cap),
                                 *(o.run(deadline) for o in owners))  # fmt: skip
            await asyncio.sleep(1.0)  # replies in flight when the clients stopped
            server_steps = await asyncio.to_thread(server.metric, "visenv_steps_total") - steps0
            fates = Counter(getattr(r, "code", "open") for r in
                            await client.get(abandoned, return_exceptions=True))  # fmt: skip
        health = await asyncio.to_thread(server.health)
        reaped = await asyncio.to_thread(server.metric, "visenv_sessions_reaped_total")
        stuck = await asyncio.to_thread(server.metric, "visenv_worker_timeouts_total")
        internal_logs = sum("INTERNAL" in line or "Traceback" in line for line in server.lines)
    finally:
        server.stop()
        for proxy in proxies:
            proxy.close()
    m2 = [rss for t, rss in audit.rss_before_kill if t >= 110] or [audit.rss[-1][1]]
    rss_growth = (m2[-1] - m2[0]) / m2[0]
    diff = server_steps - audit.acked_steps
    report = {
        "minutes": args.minutes,
        "sessions": args.sessions,
        "heavy_sessions": heavy_total,
        "fill_s": round(fill_s, 1),
        "ops": {f"{op} {outcome}": n for (op, outcome), n in sorted(audit.ops.items())},
        "steps_acknowledged": audit.acked_steps,
        "steps_applied_server": int(server_steps),
        "steps_applied_minus_acknowledged": int(diff),
        "steps_in_doubt_bound": audit.lossy_failures,
        "steps_session_lost": audit.lost_steps,
        "steps_on_reaped_sessions": audit.reaped_in_use,
        "steps_failed_otherwise": audit.other_step_errors,
        "sessions_dropped_by_sdk": audit.forgotten,
        "soak_client_errors": audit.client_errors,
        "replies_mismatched": audit.mismatched,
        "replies_dropped_by_proxy": audit.replies_dropped,
        "worker_kills": audit.kills,
        "worker_restarts": health["worker_restarts"],
        "workers_killed_as_stuck": int(stuck),
        "cap": cap,
        "max_sessions_seen": audit.max_sessions_seen,
        "capacity_answers": audit.capacity_answers,
        "abandoned": args.abandon,
        "abandoned_fates": dict(fates),
        "reaped_total": int(reaped),
        "rss_before_kills_mib": [(round(t), round(r)) for t, r in audit.rss_before_kill],
        "rss_growth_from_minute_2": round(rss_growth, 3),
        "rss_series_mib": [(round(t), round(r), n) for t, r, n in audit.rss],
        "server_internal_log_lines": internal_logs,
        "examples": audit.examples,
        "load_average": os.getloadavg(),
    }
    report["ok"] = bool(
        audit.mismatched == 0
        and audit.other_step_errors == 0
        and audit.client_errors == 0
        and 0 <= diff <= audit.lossy_failures
        and audit.max_sessions_seen <= cap
        and fates.get("open", 0) == 0
        and (args.minutes * 60 < 150 or abs(rss_growth) <= 0.10)
    )
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=10_000, help="Sokoban + FrozenLake")
    parser.add_argument("--heavy", type=int, default=2, help="sessions of each heavy env")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--idle-timeout", type=float, default=120.0)
    parser.add_argument("--abandon", type=int, default=50, help="sessions never touched")
    parser.add_argument("--single-clients", type=int, default=32)
    parser.add_argument("--single-slots", type=int, default=8, help="sessions per single client")
    parser.add_argument("--batch-clients", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=32, help="sessions per batch call")
    parser.add_argument("--lossy", type=float, default=0.25, help="fraction of lossy clients")
    parser.add_argument("--lose-rate", type=float, default=0.05, help="calls whose reply is lost")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report here")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    report = asyncio.run(soak(args))
    series = report.pop("rss_series_mib")
    print(json.dumps(report, indent=1))
    print("RSS (t s, MiB, sessions):", series)
    if args.json:
        Path(args.json).write_text(json.dumps(report | {"rss_series_mib": series}, indent=1))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
