"""Soak: many concurrent sessions, random clients, worker and gateway kills, lossy
connections, hostile requests and slow clients; audited.

A real `visenv serve` (2 workers) holds --sessions Sokoban and FrozenLake sessions plus
--heavy sessions of each heavy environment (navigation, primitive_skill, svg). Clients,
some through a lossy proxy (tests/clients/lossy_proxy.py: a reply is dropped and the
connection cut, so the SDK retries the same step_index), some through a gateway
(`visenv serve --upstream` in front of the server), visit their sessions round-robin
and pick an op at random (step 75%, get 10%, reset 8%, close and re-create 4%, nothing 3%);
batch clients send one call per op for a chunk of sessions, single clients one call per
session (the coalesced path), over gRPC and REST. A worker is SIGKILLed every
--kill-every s; its sessions answer SESSION_LOST and the clients re-create them. The
gateway is SIGKILLed every --gateway-kill-every s (half a period after the worker kills)
and started again on the same ports; its clients' SDK retries until it is back. A prober
fills the server to its cap now and then (it must answer CAPACITY, never exceed the cap);
--abandon sessions are made and never touched again (the idle reaper must close them).

Issue 42's traffic beside it:
  - --hostile-rate (1%) of all requests are drawn from issue 42's hostile inputs (a config
    nested 600 deep over REST, in a batch between good items, and over gRPC; a lone
    surrogate in a response and in an action name; step_index "0" and true; an action
    with 100,000 args; undecodable gRPC bytes; batches of max_batch_items + 1 items on
    both transports; a body over max_request_bytes), to the server or (a quarter) through
    the gateway, one at a time; each answer must be a refusal (4xx, INVALID_ARGUMENT), a
    session stepped with bad input must stay readable and unadvanced, and the good items
    of a batch are closed at once;
  - --slow-clients (50) connections, a quarter each slow-header, slow-body (a byte a
    second), silent HTTP and silent gRPC, one after another until the end: the server must
    answer or close each within its timeouts (any held past --slow-bound s fails the run);
  - two probes, a sokoban session each stepped every 0.2 s over REST and over gRPC from
    their own processes (bench/bench_batches.py), first --idle-probe s on the full but
    otherwise idle server, then through the soak: the normal client's latency against idle.

The audit, from the clients' records and the server's (/metrics, /health, process RSS):
  - every reply is for the session asked about (id and env), and its step_index is the
    one the client sent + 1 (a step applied twice or skipped would break it);
  - every failed step is SESSION_LOST (a killed worker), nothing else;
  - steps applied by the server (visenv_steps_total) = steps acknowledged to clients (the
    probes' too), give or take the steps whose reply was lost and then its session:
    lossy clients' and those cut by a gateway kill (bounded);
  - no 5xx and no INTERNAL anywhere: normal clients, hostile answers, the server's
    visenv_errors_total{code="INTERNAL"}, the server's and the gateway's logs;
  - slots: at the end the server's session count against the sessions the clients hold
    (and that still exist); then all of those closed: what is left is held by no session,
    but for creates a gateway kill cut (made or not: the reaper must close them within
    --reap-wait s);
  - sessions never above the cap; CAPACITY answered; abandoned sessions reaped;
  - server RSS (API process + workers) at the end within 10% of minute 2 (sampled just
    before each kill, when every session has been re-created).

    python bench/soak.py --duration 600          # the full soak: 10 minutes, 10,000 sessions
    python bench/soak.py --duration 3600 --json soak-1h.json   # an hour (about 1h10 in all:
                                                 # the fill, the idle probe, the audit)
    python bench/soak.py --minutes 0.5 --sessions 400 --heavy 0 --kill-every 10 \
        --idle-timeout 5 --abandon 10            # the short version (tests/service/test_soak.py)

An hour needs nothing more than --duration: every client, kill and probe loop ends by
itself at the deadline, the servers are stopped at the end, and the report (printed, and
with --json written) is the same; the RSS check compares the end with minute 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_batches import Probe, quantiles  # noqa: E402
from bench.hostile_inputs import rest_answer  # noqa: E402
from clients import AsyncEnvClient, SessionOptions  # noqa: E402
from env_server.testing.launcher import launch_server  # noqa: E402
from tests.clients.lossy_proxy import LossyProxy  # noqa: E402
from visenv.v1 import visenv_pb2 as pb  # noqa: E402
from visenv.v1 import visenv_pb2_grpc as pb_grpc  # noqa: E402

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
    touched: float = 0.0  # when the last op on it that succeeded was sent (monotonic)


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
    calls: int = 0  # calls of the normal clients (the base of the hostile share)
    t0: float = 0.0  # the soak's start (monotonic)
    kill_times: list[int] = field(default_factory=list)  # s after t0: worker kills
    gateway_kill_times: list[int] = field(default_factory=list)
    slow_calls: list[tuple[int, str, float]] = field(default_factory=list)  # (t, label, s) > 10 s
    cap_probes_skipped: int = 0  # the population was far below the cap (--probe-room)
    reaped_said_closed: int = 0  # steps on sessions idle past the timeout, NOT_FOUND "was closed"
    latency: dict[str, list[float]] = field(default_factory=dict)  # label -> seconds per call
    gateway_kills: int = 0
    gateway_down_s: list[float] = field(default_factory=list)
    gateway_steps_in_doubt: int = 0  # steps through the gateway cut by a kill, not answered
    creates_in_doubt: int = 0  # items of creates cut by a gateway kill (made or not)
    orphans: list[str] = field(default_factory=list)  # sessions dropped while maybe alive
    hostile: dict = field(default_factory=lambda: defaultdict(Counter))  # (kind, via) -> answers
    hostile_5xx: int = 0
    hostile_wrong: int = 0
    hostile_sessions_made: int = 0  # good items of hostile batches (closed at once)
    slow: dict = field(default_factory=lambda: defaultdict(Counter))  # kind -> how each ended
    slow_held: dict[str, float] = field(default_factory=dict)  # kind -> longest connection s

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
                 audit: Audit, rng: random.Random, gateway: bool = False) -> None:  # fmt: skip
        self.name, self.slots, self.batch, self.args = name, slots, batch, args
        self.proxy, self.audit, self.rng = proxy, audit, rng
        address = proxy.address if proxy is not None else address
        # through the gateway: retried for as long as a killed gateway takes to come back
        retries = 40 if gateway else 5
        self.client = AsyncEnvClient(address, transport=transport, timeout=300, retries=retries)
        self.label = (f"{'batch' if batch else 'single'} {transport}"
                      f"{' via gateway' if gateway else ''}{' lossy' if proxy else ''}")  # fmt: skip
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

    def timed(self, op: str, started: float) -> None:
        self.audit.calls += 1
        took = time.perf_counter() - started
        self.audit.latency.setdefault(f"{self.label} {op}", []).append(took)
        if took > 10 and len(self.audit.slow_calls) < 300:
            self.audit.slow_calls.append(
                (round(time.monotonic() - self.audit.t0), f"{self.label} {op}", round(took, 1))
            )

    async def _create(self, slots: list[Slot]) -> None:
        started, sent_at = time.perf_counter(), time.monotonic()
        results = await self._per_item_errors(self.client.create([self.options(s) for s in slots],
                                                       return_exceptions=True), len(slots))  # fmt: skip
        self.timed("create", started)
        unavailable = False
        for slot, r in zip(slots, results, strict=True):
            outcome = self.record("create", r)
            if outcome == "UNAVAILABLE":  # cut by a gateway kill: made or not, nobody knows
                self.audit.creates_in_doubt += 1
                unavailable = True
            if outcome == "ok":
                slot.sid, slot.done, slot.touched = r.session_id, r.done, sent_at
                if r.env != slot.env or r.step_index != 0:
                    self.audit.mismatched += 1
                    self.audit.note(f"create {slot.env}: got {r.env} step_index {r.step_index}")
            elif outcome == "CAPACITY":
                self.audit.capacity_answers += 1
        if unavailable:  # (the SDK does not retry a create over gRPC: no spinning meanwhile)
            await asyncio.sleep(1.0)

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
        started, sent_at = time.perf_counter(), time.monotonic()
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
            self.timed(op, started)
            for slot, r in zip(slots, results, strict=True):
                if self.record("close", r) != "ok" and "unreachable" in str(r):
                    self.audit.orphans.append(slot.sid)  # maybe still open
                slot.sid = None
            return
        self.timed(op, started)
        lossy, self.armed = self.armed, False
        for slot, index, r in zip(slots, sent, results, strict=True):
            outcome = self.record(op, r)
            if outcome != "ok":
                cut = outcome == "SESSION_LOST" and "unreachable" in str(r)
                if cut:  # no answer after every retry: the session may well be alive
                    self.audit.orphans.append(slot.sid)
                if op == "step":
                    if outcome == "SESSION_LOST":
                        self.audit.lost_steps += 1
                        if cut and self.proxy is None:  # a gateway kill (lossy: below)
                            self.audit.gateway_steps_in_doubt += 1
                    elif outcome == "NOT_FOUND" and "idle" in str(r):
                        self.audit.reaped_in_use += 1  # idle past the timeout: refused, clearly
                    elif (outcome == "NOT_FOUND" and "was closed" in str(r)
                          and time.monotonic() - slot.touched > self.args.idle_timeout):  # fmt: skip
                        # reaped too, but answered as if closed by a client: the server's
                        # reaper forgets the session ("was closed") before it records why
                        self.audit.reaped_said_closed += 1
                    else:
                        self.audit.other_step_errors += 1
                        self.audit.note(f"step {slot.sid} ({self.name}): {outcome}: {r}")
                    self.audit.lossy_failures += lossy
                self.failed(slot, outcome)
                continue
            self.check(op, slot, r, index + 1)
            slot.done, slot.touched = r.done, sent_at  # (the server's last use is later)
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
                    audit.kill_times.append(round(now - t0))
                next_kill += args.kill_every
            room = cap - health["sessions"]
            if now >= next_probe and room > args.probe_room:
                # far from the cap (a worker kill halved the sessions): filling thousands of
                # sessions would hold the server at its cap for a minute, refusing every
                # client's re-create (CAPACITY), and the population would never recover
                audit.cap_probes_skipped += 1
                next_probe += 45.0
            elif now >= next_probe:
                next_probe += 45.0
                made = await prober.create([SessionOptions("sokoban", seed=s) for s in
                                            range(max(room, 0) + 20)], return_exceptions=True)  # fmt: skip
                codes = Counter(getattr(r, "code", "ok") for r in made)
                audit.ops[("cap-probe", "CAPACITY")] += codes["CAPACITY"]
                audit.capacity_answers += codes["CAPACITY"]
                ids = [r.session_id for r in made if not isinstance(r, Exception)]
                if ids:
                    await prober.close(ids)


def deep(n: int) -> str:
    """A JSON object nested n deep."""
    return '{"a":' * n + "1" + "}" * n


def free_port() -> int:
    """A free loopback port below the ephemeral range (so that no client connection takes it
    while the gateway is down)."""
    for _ in range(200):
        port = random.randrange(20_000, 30_000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


class Gateway:
    """`visenv serve --upstream` in front of the server, on fixed ports (so that its clients
    find it again after a kill)."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.port, self.grpc_port = upstream, free_port(), free_port()
        self.http, self.grpc = f"127.0.0.1:{self.port}", f"127.0.0.1:{self.grpc_port}"
        self.output: list[str] = []  # every instance's log lines
        self.server = self._launch()

    def _launch(self):
        server = launch_server(workers=None, envs=None, upstreams=[self.upstream],
                               args=["--port", str(self.port), "--grpc-port", str(self.grpc_port)],
                               timeout=300, ready="answers", inherit_env=True)  # fmt: skip
        self.instance_lines = server.output
        return server

    def kill_and_restart(self) -> float:
        """SIGKILL the gateway, start it again on the same ports; seconds it was down."""
        t0 = time.monotonic()
        self.server.kill()
        self.output += self.instance_lines
        for attempt in range(3):
            try:
                self.server = self._launch()
                break
            except RuntimeError:  # a port taken for a moment: try again
                if attempt == 2:
                    raise
                time.sleep(2.0)
        return time.monotonic() - t0

    def stop(self) -> None:
        self.server.stop()
        self.output += self.instance_lines


async def gateway_killer(gateway: Gateway, audit: Audit, every: float, t0: float,
                         deadline: float) -> None:  # fmt: skip
    """SIGKILL the gateway every `every` s (half a period after the worker kills)."""
    next_kill = t0 + every / 2
    while True:
        await asyncio.sleep(max(0.0, min(next_kill, deadline) - time.monotonic()))
        if time.monotonic() >= deadline - 5:
            return
        audit.gateway_kill_times.append(round(time.monotonic() - t0))
        down = await asyncio.to_thread(gateway.kill_and_restart)
        audit.gateway_kills += 1
        audit.gateway_down_s.append(round(down, 1))
        next_kill += every


# ---- hostile traffic: issue 42's probes, a share of all requests ----------------------
HOSTILE_KINDS = (
    "rest create, config 600 deep",
    "rest batch/create [good, 600 deep, good]",
    "rest step, response '\\ud800'",
    "rest step, action name '\\ud800'",
    'rest step, step_index "0"',
    "rest step, step_index true",
    "rest step, Left with 100,000 args",
    "rest batch/create, max_batch_items + 1",
    "rest batch/step, body over max_request_bytes",
    "grpc Create, config_json 600 deep",
    "grpc Get, undecodable bytes",
    "grpc Create, max_batch_items + 1",
)
JSON = {"content-type": "application/json"}


class Hostile:
    """Sends one of HOSTILE_KINDS (at random) whenever hostile requests fall below `rate`
    of all requests (the normal clients' calls + these), one at a time, to the server or
    (a quarter of them) through the gateway. Each answer is checked: a refusal (4xx,
    INVALID_ARGUMENT) that costs nothing; a session stepped with bad input still readable
    and not advanced; no slot left held (good items of a batch closed at once)."""

    def __init__(self, server: Server, gateway: Gateway | None, audit: Audit,
                 rng: random.Random, limits: dict) -> None:  # fmt: skip
        self.server, self.gateway, self.audit, self.rng = server, gateway, audit, rng
        self.http = httpx.AsyncClient(timeout=120)
        options = [("grpc.max_send_message_length", 64 << 20)]
        self.channels = {"server": grpc.aio.insecure_channel(server.grpc, options=options)}
        if gateway is not None:
            self.channels["gateway"] = grpc.aio.insecure_channel(gateway.grpc, options=options)
        self.sid: str | None = None  # a sokoban session of its own (made on the server)
        items = limits["max_batch_items"] + 1
        self.too_many = json.dumps({"items": [{"env": "sokoban", "seed": s}
                                              for s in range(items)]}).encode()  # fmt: skip
        self.too_many_pb = pb.CreateRequest(items=[pb.SessionOptions(env="sokoban", seed=s)
                                                   for s in range(items)])  # fmt: skip
        self.too_big = json.dumps({"items": [{"session_id": "s-x", "step_index": 0,
                                              "response": "x" * limits["max_request_bytes"]}]}
                                  ).encode()  # fmt: skip
        self.sent = 0

    def base(self, target: str) -> str:
        http = self.server.http if target == "server" else self.gateway.http
        return f"http://{http}"

    async def own_session(self) -> str:
        if self.sid is None:
            r = await self.http.post(f"{self.base('server')}/v1/sessions",
                                     json={"env": "sokoban", "format": "no_think"})  # fmt: skip
            if r.status_code != 200:  # e.g. 429: the cap prober holds the server full
                raise LookupError(f"{r.status_code}")
            self.sid = r.json()["session_id"]
        return self.sid

    rest_answer = staticmethod(rest_answer)  # bench/hostile_inputs.py's: status, code, field

    async def close_made(self, base: str, sids: list[str]) -> None:
        if sids:
            self.audit.hostile_sessions_made += len(sids)
            await self.http.post(f"{base}/v1/batch/close", json={"session_ids": sids})

    async def one(self, kind: str, target: str) -> tuple[str, str | None]:
        """(answer, what was wrong with it or None)."""
        base = self.base(target)
        if kind == "rest create, config 600 deep":
            r = await self.http.post(f"{base}/v1/sessions", headers=JSON,
                                     content=f'{{"env":"sokoban","config":{deep(600)}}}')  # fmt: skip
            if r.status_code == 200:
                await self.close_made(base, [r.json()["session_id"]])
            return self.rest_answer(r), None if 400 <= r.status_code < 500 else "not refused"
        if kind == "rest batch/create [good, 600 deep, good]":
            good = '{"env":"sokoban"}'
            body = f'{{"items":[{good},{{"env":"sokoban","config":{deep(600)}}},{good}]}}'
            r = await self.http.post(f"{base}/v1/batch/create", headers=JSON, content=body)
            if r.status_code != 200:
                return self.rest_answer(r), "not answered per item"
            items = r.json()["results"]
            codes = [i["error"]["code"] if not i["ok"] else "ok" for i in items]
            await self.close_made(base, [i["reply"]["session_id"] for i in items if i["ok"]])
            fine = (codes[1] == "INVALID_ARGUMENT"
                    and all(c in ("ok", "CAPACITY") for c in (codes[0], codes[2])))  # fmt: skip
            return f"200 {','.join(codes)}", None if fine else "items answered wrongly"
        if kind.startswith("rest step"):
            sid = await self.own_session()
            before = await self.http.get(f"{self.base('server')}/v1/sessions/{sid}")
            if before.status_code != 200:  # lost with a killed worker: a new one next time
                self.sid = None
                return "own session gone", None
            index = before.json()["step_index"]
            body = {
                "rest step, response '\\ud800'":
                    f'{{"step_index":{index},"response":"<answer>\\ud800</answer>"}}',
                "rest step, action name '\\ud800'":
                    f'{{"step_index":{index},"actions":[{{"name":"\\ud800"}}]}}',
                'rest step, step_index "0"': '{"step_index":"0","actions":[{"name":"Left"}]}',
                "rest step, step_index true": '{"step_index":true,"actions":[{"name":"Left"}]}',
                "rest step, Left with 100,000 args": json.dumps(
                    {"step_index": index, "actions": [{"name": "Left", "args": [0] * 100_000}]}),
            }[kind]  # fmt: skip
            r = await self.http.post(f"{base}/v1/sessions/{sid}/step", headers=JSON, content=body)
            after = await self.http.get(f"{self.base('server')}/v1/sessions/{sid}")
            answer = f"{self.rest_answer(r)}; GET after {after.status_code}"
            if after.status_code in (404, 410):  # its worker was killed meanwhile
                self.sid = None
                return answer, None if r.status_code < 500 else "5xx"
            if not 400 <= r.status_code < 500:
                return answer, "not refused"
            if after.status_code != 200:
                return answer, "session unreadable after"
            if after.json()["step_index"] != index:
                return answer, "applied"
            return answer, None
        if kind == "rest batch/create, max_batch_items + 1":
            r = await self.http.post(f"{base}/v1/batch/create", headers=JSON,
                                     content=self.too_many)  # fmt: skip
            if r.status_code == 200:
                items = r.json()["results"]
                await self.close_made(base, [i["reply"]["session_id"] for i in items if i["ok"]])
            return self.rest_answer(r), None if 400 <= r.status_code < 500 else "not refused"
        if kind == "rest batch/step, body over max_request_bytes":
            r = await self.http.post(f"{base}/v1/batch/step", headers=JSON, content=self.too_big)
            return self.rest_answer(r), None if r.status_code == 413 else "not 413"
        stub = pb_grpc.VisenvStub(self.channels[target])
        try:
            if kind == "grpc Create, config_json 600 deep":
                reply = await stub.Create(pb.CreateRequest(items=[pb.SessionOptions(
                    env="sokoban", config_json=deep(600))]), timeout=120)  # fmt: skip
                made = [r.reply.session_id for r in reply.results
                        if r.WhichOneof("result") == "reply"]  # fmt: skip
                await self.close_made(base, made)
                codes = ",".join(r.error.code or "ok" for r in reply.results)
                return f"OK {codes}", None if codes == "INVALID_ARGUMENT" else "not refused"
            if kind == "grpc Get, undecodable bytes":
                raw = self.channels[target].unary_unary(
                    "/visenv.v1.Visenv/Get", request_serializer=None, response_deserializer=None
                )
                await raw(b"\x0a\x02\xff\xfe", timeout=120)
                return "OK", "not refused"
            reply = await stub.Create(self.too_many_pb, timeout=120)
            made = [r.reply.session_id for r in reply.results if r.WhichOneof("result") == "reply"]
            await self.close_made(base, made)
            return f"OK ({len(made)} made)", "not refused"
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            if code == "UNAVAILABLE" and target == "gateway":
                raise ConnectionError("gateway down") from exc
            bad = None if code == "INVALID_ARGUMENT" else (
                "5xx" if code in ("INTERNAL", "UNKNOWN") else "unexpected code")  # fmt: skip
            return code, bad

    async def run(self, rate: float, deadline: float) -> None:
        try:
            while time.monotonic() < deadline:
                due = self.audit.calls * rate / (1 - rate)
                if self.sent >= due:
                    await asyncio.sleep(0.05)
                    continue
                kind = self.rng.choice(HOSTILE_KINDS)
                target = "gateway" if self.gateway and self.rng.random() < 0.25 else "server"
                self.sent += 1
                try:
                    answer, wrong = await asyncio.wait_for(self.one(kind, target), 300)
                except LookupError as exc:  # its own session could not be made: no probe
                    answer, wrong = f"own session not made ({exc})", None
                except (httpx.ConnectError, ConnectionError, httpx.RemoteProtocolError,
                        httpx.ReadError) as exc:  # fmt: skip
                    if target != "gateway":
                        raise
                    answer, wrong = f"gateway down ({type(exc).__name__})", None
                except Exception as exc:  # noqa: BLE001  (counted and shown: a bug somewhere)
                    answer, wrong = f"client error {type(exc).__name__}", "client error"
                    self.audit.note(f"hostile {kind} via {target}: {type(exc).__name__}: {exc}")
                self.audit.hostile[(kind, target)][answer] += 1
                if answer[:1] == "5" or wrong == "5xx" or "INTERNAL" in answer:
                    self.audit.hostile_5xx += 1
                if wrong is not None:
                    self.audit.hostile_wrong += 1
                    self.audit.note(f"hostile {kind} via {target}: {answer} ({wrong})")
        finally:
            if self.sid is not None:
                with contextlib.suppress(httpx.HTTPError):
                    await self.http.delete(f"{self.base('server')}/v1/sessions/{self.sid}")
            await self.http.aclose()
            for channel in self.channels.values():
                await channel.close()


# ---- slow clients: slow-header, slow-body and silent connections -----------------------
SLOW_KINDS = ("slow-header", "slow-body", "silent", "silent-grpc")


async def slow_client(kind: str, http: str, grpc_address: str, audit: Audit, deadline: float,
                      bound: float) -> None:  # fmt: skip
    """One slow client: a connection after another until the deadline, each sending as
    slowly as its kind says (a byte every second, or nothing) until the server answers or
    closes it, or `bound` s pass (then it counts as held)."""
    host, port = (grpc_address if kind == "silent-grpc" else http).rsplit(":", 1)
    while time.monotonic() < deadline - 1:
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 10)
        except (TimeoutError, OSError) as exc:
            audit.slow[kind][f"connect failed: {type(exc).__name__}"] += 1
            await asyncio.sleep(1.0)
            continue
        if kind == "slow-header":
            writer.write(b"POST /v1/sessions HTTP/1.1\r\nhost: soak\r\nx-slow: ")
        elif kind == "slow-body":
            writer.write(b"POST /v1/sessions HTTP/1.1\r\nhost: soak\r\ncontent-type: "
                         b"application/json\r\ncontent-length: 100000\r\n\r\n{")  # fmt: skip
        ended = answer = None
        try:
            while ended is None:
                try:
                    data = await asyncio.wait_for(reader.read(4096), 1.0)
                    if data.startswith(b"HTTP/") and answer is None:
                        answer = "answered " + data.split(b" ", 2)[1].decode() + ", closed"
                    if not data:  # (gRPC's server sends its settings at once: read on)
                        ended = answer or "closed"
                except TimeoutError:
                    now = time.monotonic()
                    if now - t0 > bound:
                        ended = "held to our bound"
                    elif now > deadline:
                        ended = "open at the end"
                    elif kind in ("slow-header", "slow-body"):
                        writer.write(b"a")  # one more byte a second
                        await writer.drain()
                except (ConnectionError, OSError):
                    ended = "reset"
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        held = time.monotonic() - t0
        audit.slow[kind][ended] += 1
        if ended != "open at the end":
            audit.slow_held[kind] = max(audit.slow_held.get(kind, 0.0), held)


def latency_table(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out = {}
    for label, xs in sorted(samples.items()):
        n, p50, p99, worst = quantiles(xs)
        out[label] = {"n": n, "p50_ms": round(p50, 1), "p99_ms": round(p99, 1),
                      "max_ms": round(worst, 1)}  # fmt: skip
    return out


def alive(address: str, sids: list[str]) -> list[str]:
    """Those of `sids` the server holds (a Get answers them), 200 a call."""
    out = []
    options = [("grpc.max_receive_message_length", 1 << 30)]  # (replies carry images)
    with grpc.insecure_channel(address, options=options) as channel:
        stub = pb_grpc.VisenvStub(channel)
        for start in range(0, len(sids), 200):
            part = sids[start : start + 200]
            reply = stub.Get(pb.GetRequest(session_ids=part), timeout=300)
            out += [sid for sid, r in zip(part, reply.results, strict=True)
                    if r.WhichOneof("result") == "reply"]  # fmt: skip
    return out


def close_all(address: str, sids: list[str]) -> None:
    """Close sessions by id on the server (whoever made them), 1,000 a call."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.VisenvStub(channel)
        for start in range(0, len(sids), 1000):
            stub.Close(pb.CloseRequest(session_ids=sids[start : start + 1000]), timeout=300)


async def soak(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    heavy_total = len(HEAVY) * args.heavy
    cap = args.sessions + heavy_total + args.abandon + 64
    load_start = os.getloadavg()
    server = Server(args, cap)
    audit = Audit()
    proxies: list[LossyProxy] = []
    probes: list[Probe] = []
    gateway: Gateway | None = None
    try:
        limits = await asyncio.to_thread(
            lambda: httpx.get(f"http://{server.http}/v1/limits", timeout=300).json()
        )
        n_single = args.single_clients
        n_lossy = int(n_single * args.lossy)
        n_gateway = min(args.gateway_clients, n_single - n_lossy)
        n_batch_lossy = int(args.batch_clients * args.lossy)
        n_batch_gateway = min(args.gateway_batch_clients, args.batch_clients - n_batch_lossy)
        if n_gateway or n_batch_gateway:
            gateway = await asyncio.to_thread(Gateway, server.grpc)
        light = [Slot(LIGHT[i % 2]) for i in range(args.sessions)]
        singles, batched = (
            light[: n_single * args.single_slots],
            light[n_single * args.single_slots :],
        )
        owners: list[Owner] = []
        for i in range(n_single):
            lossy = i < n_lossy
            via = gateway is not None and i >= n_single - n_gateway  # the last ones
            transport = "http" if i % 2 else "grpc"
            target = gateway if via else server
            address = target.http if transport == "http" else target.grpc
            proxy = LossyProxy(address) if lossy else None
            proxies += [proxy] if proxy else []
            owners.append(Owner(f"single-{i}", singles[i * args.single_slots:(i + 1) * args.single_slots],
                                address, transport, proxy, False, args, audit,
                                random.Random(rng.random()), gateway=via))  # fmt: skip
        per = max(1, -(-len(batched) // args.batch_clients))
        for i in range(args.batch_clients):
            lossy = i < n_batch_lossy
            via = gateway is not None and i >= args.batch_clients - n_batch_gateway
            address = gateway.grpc if via else server.grpc
            proxy = LossyProxy(address) if lossy else None
            proxies += [proxy] if proxy else []
            owners.append(Owner(f"batch-{i}", batched[i * per:(i + 1) * per], address, "grpc",
                                proxy, True, args, audit, random.Random(rng.random()),
                                gateway=via))  # fmt: skip
        if heavy_total:
            heavy = [Slot(env) for env in HEAVY for _ in range(args.heavy)]
            owners.append(Owner("heavy", heavy, server.grpc, "grpc", None, False, args, audit,
                                random.Random(rng.random())))  # fmt: skip
        owners = [o for o in owners if o.slots]
        # the population first (batched creates), then the abandoned sessions
        t_fill = time.monotonic()
        await asyncio.gather(*(o.create([s for s in o.slots if s.env in LIGHT]) for o in owners))
        fill_s = time.monotonic() - t_fill
        audit.calls, audit.latency, audit.slow_calls = 0, {}, []  # the fill is not the soak
        # the probes: one sokoban session each (REST, gRPC), stepped every 0.2 s from its own
        # process; first on the full but otherwise idle server, then during the soak
        probes = [Probe("http", f"http://{server.http}"), Probe("grpc", server.grpc)]
        for p in probes:
            await asyncio.to_thread(p.wait_ready)
        await asyncio.sleep(2.0)
        idle_from = time.monotonic()
        await asyncio.sleep(args.idle_probe)
        idle_to = time.monotonic()
        async with AsyncEnvClient(server.grpc, timeout=300) as client:
            abandoned = [r.session_id for r in await client.create(
                [SessionOptions("frozenlake", seed=s) for s in range(args.abandon)])]  # fmt: skip
            t0 = audit.t0 = time.monotonic()
            deadline = t0 + args.minutes * 60
            read0 = time.monotonic()
            steps0 = await asyncio.to_thread(server.metric, "visenv_steps_total")
            read1 = time.monotonic()
            hostile = Hostile(server, gateway, audit, random.Random(rng.random()), limits)
            extra = [hostile.run(args.hostile_rate, deadline)] if args.hostile_rate > 0 else []
            extra += [slow_client(SLOW_KINDS[i % len(SLOW_KINDS)], server.http, server.grpc, audit,
                                  deadline, args.slow_bound)
                      for i in range(args.slow_clients)]  # fmt: skip
            if gateway is not None and args.gateway_kill_every > 0:
                extra.append(gateway_killer(gateway, audit, args.gateway_kill_every, t0, deadline))
            await asyncio.gather(monitor(server, audit, args, t0, deadline, cap),
                                 *(o.run(deadline) for o in owners), *extra)  # fmt: skip
            soak_to = time.monotonic()
            for p in probes:
                await asyncio.to_thread(p.stop)
            await asyncio.sleep(1.0)  # replies in flight when the clients stopped
            server_steps = await asyncio.to_thread(server.metric, "visenv_steps_total") - steps0
            fates = await client.get(abandoned, return_exceptions=True)
        fate_counts = Counter(getattr(r, "code", "open") for r in fates)
        # slots: the server's count against the sessions the clients hold; then every one
        # of those closed (and any that a cut call may have left open): what is left is held
        # by no session (or by one a gateway kill cut the create of: at most creates_in_doubt)
        held = [s.sid for o in owners for s in o.slots if s.sid is not None]
        held += [
            sid for sid, r in zip(abandoned, fates, strict=True) if not isinstance(r, Exception)
        ]
        health = await asyncio.to_thread(server.health)
        living = await asyncio.to_thread(alive, server.grpc, held)  # (not lost with a worker)
        slots = {"server_sessions_at_end": health["sessions"], "held_by_clients": len(held),
                 "held_by_clients_alive": len(living),
                 "server_minus_clients_alive": health["sessions"] - len(living)}  # fmt: skip
        await asyncio.to_thread(close_all, server.grpc, list(dict.fromkeys(held + audit.orphans)))
        slots["left_after_closing_all"] = (await asyncio.to_thread(server.health))["sessions"]
        slots["bound_creates_in_doubt"] = audit.creates_in_doubt
        waited, left = 0.0, slots["left_after_closing_all"]
        until = time.monotonic() + args.reap_wait
        while left > 0 and time.monotonic() < until:  # the reaper closes what a cut create made
            await asyncio.sleep(5.0)
            left = (await asyncio.to_thread(server.health))["sessions"]
            waited = args.reap_wait - (until - time.monotonic())
        slots["left_after_reaper_wait"] = left
        slots["reaper_wait_s"] = round(waited)
        health = await asyncio.to_thread(server.health)
        reaped = await asyncio.to_thread(server.metric, "visenv_sessions_reaped_total")
        stuck = await asyncio.to_thread(server.metric, "visenv_worker_timeouts_total")
        body = await asyncio.to_thread(
            lambda: httpx.get(f"http://{server.http}/metrics", timeout=60).text
        )
        error_codes = {line.split('"')[1]: int(float(line.rsplit(" ", 1)[1]))
                       for line in body.splitlines() if line.startswith("visenv_errors_total{")}  # fmt: skip
        internal_logs = sum("INTERNAL" in line or "Traceback" in line for line in server.lines)
    finally:
        for p in probes:
            p.stop()
        if gateway is not None:
            gateway.stop()
        server.stop()
        for proxy in proxies:
            proxy.close()
    gateway_logs = sum("INTERNAL" in line or "Traceback" in line
                       for line in (gateway.output if gateway else []))  # fmt: skip
    m2 = [rss for t, rss in audit.rss_before_kill if t >= 110] or [audit.rss[-1][1]]
    rss_growth = (m2[-1] - m2[0]) / m2[0]
    # the probes' steps count on the server too: those acknowledged after the first read
    # of the counter; one that overlapped that read may have been counted before it or not
    probe_acked = sum(t > read1 for p in probes for t, _ in p.steps)
    probe_straddling = sum(t <= read1 and t + dt >= read0 for p in probes for t, dt in p.steps)
    diff = server_steps - audit.acked_steps - probe_acked
    in_doubt = audit.lossy_failures + audit.gateway_steps_in_doubt + probe_straddling
    normal_5xx = sum(
        n for (op, outcome), n in audit.ops.items() if outcome in ("INTERNAL", "UNKNOWN")
    )
    errors_5xx = {
        "normal_clients_INTERNAL_or_UNKNOWN": normal_5xx,
        "normal_clients_UNAVAILABLE": sum(
            n for (op, outcome), n in audit.ops.items() if outcome == "UNAVAILABLE"
        ),  # fmt: skip
        "hostile_5xx_or_INTERNAL": audit.hostile_5xx,
        "server_errors_total_INTERNAL": error_codes.get("INTERNAL", 0),
        "server_log_lines_INTERNAL_or_traceback": internal_logs,
        "gateway_log_lines_INTERNAL_or_traceback": gateway_logs,
    }
    probe_stats = {}
    for p in probes:
        for window, (a, b) in (("idle", (idle_from, idle_to)), ("soak", (t0, soak_to))):
            n, p50, p99, worst = quantiles(p.during(a, b))
            probe_stats[f"{p.name} probe, {window}"] = {
                "n": n,
                "p50_ms": round(p50, 1),
                "p99_ms": round(p99, 1),
                "max_ms": round(worst, 1),
            }
        probe_stats[f"{p.name} probe, steps lost"] = len(p.lost)
    hostile_sent = sum(sum(c.values()) for c in audit.hostile.values())
    report = {
        "minutes": args.minutes,
        "sessions": args.sessions,
        "heavy_sessions": heavy_total,
        "fill_s": round(fill_s, 1),
        "ops": {f"{op} {outcome}": n for (op, outcome), n in sorted(audit.ops.items())},
        "steps_acknowledged": audit.acked_steps,
        "steps_acknowledged_probes": probe_acked,
        "steps_applied_server": int(server_steps),
        "steps_applied_minus_acknowledged": int(diff),
        "steps_in_doubt_bound": in_doubt,
        "steps_in_doubt_gateway_kills": audit.gateway_steps_in_doubt,
        "steps_session_lost": audit.lost_steps,
        "steps_on_reaped_sessions": audit.reaped_in_use,
        "steps_on_reaped_sessions_answered_was_closed": audit.reaped_said_closed,
        "steps_failed_otherwise": audit.other_step_errors,
        "sessions_dropped_by_sdk": audit.forgotten,
        "soak_client_errors": audit.client_errors,
        "replies_mismatched": audit.mismatched,
        "replies_dropped_by_proxy": audit.replies_dropped,
        "worker_kills": audit.kills,
        "worker_restarts": health["worker_restarts"],
        "workers_killed_as_stuck": int(stuck),
        "gateway_kills": audit.gateway_kills,
        "gateway_kill_times_s": audit.gateway_kill_times,
        "worker_kill_times_s": audit.kill_times,
        "calls_over_10_s": audit.slow_calls,
        "gateway_down_s": audit.gateway_down_s,
        "cap": cap,
        "max_sessions_seen": audit.max_sessions_seen,
        "capacity_answers": audit.capacity_answers,
        "cap_probes_skipped": audit.cap_probes_skipped,
        "abandoned": args.abandon,
        "abandoned_fates": dict(fate_counts),
        "reaped_total": int(reaped),
        "slots": slots,
        "errors_5xx": errors_5xx,
        "server_error_codes": error_codes,
        "normal_calls": audit.calls,
        "hostile_requests": hostile_sent,
        "hostile_share": round(hostile_sent / max(1, hostile_sent + audit.calls), 4),
        "hostile_wrong_answers": audit.hostile_wrong,
        "hostile_answers": {
            f"{kind} (via {via})": dict(c) for (kind, via), c in sorted(audit.hostile.items())
        },  # fmt: skip
        "hostile_sessions_made_and_closed": audit.hostile_sessions_made,
        "slow_clients": {kind: dict(c) for kind, c in sorted(audit.slow.items())},
        "slow_longest_connection_s": {k: round(v, 1) for k, v in sorted(audit.slow_held.items())},
        "probe": probe_stats,
        "latency_per_call": latency_table(audit.latency),
        "rss_before_kills_mib": [(round(t), round(r)) for t, r in audit.rss_before_kill],
        "rss_growth_from_minute_2": round(rss_growth, 3),
        "rss_series_mib": [(round(t), round(r), n) for t, r, n in audit.rss],
        "server_internal_log_lines": internal_logs,
        "examples": audit.examples,
        "load_average_start": load_start,
        "load_average": os.getloadavg(),
    }
    held_to_bound = sum(c["held to our bound"] for c in audit.slow.values())
    report["ok"] = bool(
        audit.mismatched == 0
        and audit.other_step_errors == 0
        and audit.client_errors == 0
        and 0 <= diff <= in_doubt
        and audit.max_sessions_seen <= cap
        and fate_counts.get("open", 0) == 0
        and (args.minutes * 60 < 150 or abs(rss_growth) <= 0.10)
        and audit.hostile_wrong == 0
        and all(v == 0 for k, v in errors_5xx.items() if k != "normal_clients_UNAVAILABLE")
        and slots["left_after_closing_all"] <= audit.creates_in_doubt
        and (slots["left_after_reaper_wait"] == 0 or args.reap_wait == 0)
        and held_to_bound == 0
    )
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--duration", type=float, help="seconds (instead of --minutes)")
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
    parser.add_argument("--gateway-clients", type=int, default=8,
                        help="single clients through the gateway (0 and no batch ones: none)")  # fmt: skip
    parser.add_argument("--gateway-batch-clients", type=int, default=1)
    parser.add_argument("--gateway-kill-every", type=float, default=60.0,
                        help="seconds between gateway SIGKILLs (0: never)")  # fmt: skip
    parser.add_argument("--hostile-rate", type=float, default=0.01,
                        help="share of all requests drawn from issue 42's hostile inputs")  # fmt: skip
    parser.add_argument("--slow-clients", type=int, default=50,
                        help="slow-header, slow-body, silent HTTP and silent gRPC connections")  # fmt: skip
    parser.add_argument("--slow-bound", type=float, default=120.0,
                        help="seconds a slow connection may stay open before it counts as held")  # fmt: skip
    parser.add_argument("--idle-probe", type=float, default=15.0,
                        help="seconds the probes step on the full, otherwise idle server first")  # fmt: skip
    parser.add_argument("--reap-wait", type=float, default=None,
                        help="seconds to wait at the end for the reaper to close sessions left "
                        "by cut creates (default: the idle timeout + 60)")  # fmt: skip
    parser.add_argument("--probe-room", type=int, default=1000,
                        help="the cap prober fills the server only when at most this many "
                        "sessions are missing to the cap")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    if args.duration is not None:
        args.minutes = args.duration / 60
    if args.reap_wait is None:
        args.reap_wait = args.idle_timeout + 60
    return args


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers (finally) on a kill
    report = asyncio.run(soak(args))
    series = report.pop("rss_series_mib")
    print(json.dumps(report, indent=1))
    print("RSS (t s, MiB, sessions):", series)
    if args.json:
        Path(args.json).write_text(json.dumps(report | {"rss_series_mib": series}, indent=1))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
