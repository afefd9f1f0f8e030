"""Training-sized batches (issues 22 and 42): cost per item, a probe session's latency
meanwhile, start-up.

Against one `visenv serve` it starts itself (2 workers, frozenlake and sokoban, PNG images):

- for each size N (512, 2,048 and 4,096 by default) and each transport (REST, then gRPC,
  alternating so both see the same load): a batch create of N frozenlake sessions, a batch
  step of them (explicit actions) and a batch close; wall time per item of each (it should
  be flat: the cost linear in the items);
- all the while, two probes, each in its own process (so that the bench's own client, busy
  encoding or decoding 4,096 items, never delays them): one sokoban session stepped every
  0.2 s through the SDK (`EnvClient`), one probe over REST and one over gRPC. Their p50, p99
  and worst step while each batch's create, step and close run, against the same probes on
  the idle server first (issue 42's target: p99 at most 150 ms while a 4,096-item batch
  runs, on either transport);
- the time from starting `visenv serve` to its printed address, its first answered
  request and (with `--startup-envs`, e.g. every env) every environment ready.

    python bench/bench_batches.py                          # about three minutes here
    python bench/bench_batches.py --sizes 64,512 --startup-envs sokoban,primitive_skill
    python bench/bench_batches.py --sizes 4096 --py-spy profiles/   # py-spy of the server
                                          # (API process and workers, idle samples too)

A probe's step is timed from its call to its answer; the next starts 0.2 s after the
previous one started (at once if that one took longer: a slow step delays the next probe,
it is not counted twice).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
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

    def __init__(self, envs: str, workers: int, extra: list[str] = (),
                 extra_env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.started = time.monotonic()
        server = launch_server(workers=workers, envs=envs, idle_timeout=0, args=extra,
                               extra_env=extra_env, timeout=300, ready="banner")  # fmt: skip
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


PROBE_ENV = "sokoban"
PROBE_EVERY = 0.2  # seconds between the starts of a probe's steps
PROBE_LIMIT = 3600.0  # a probe process stops by itself after this long, whatever happens


def probe_child(transport: str, address: str, every: float, limit: float) -> None:
    """A probe process: one sokoban session stepped every `every` s through the SDK until
    stdin closes (or `limit` s). Prints `step <start> <seconds>` per timed step (start on
    the system-wide monotonic clock), `lost <start> <code>` for a step that failed (the
    session is made again, untimed)."""
    from clients import EnvClient, SessionOptions
    from clients.errors import CapacityError, SessionLost, VisenvError

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    options = SessionOptions(PROBE_ENV, seed=0, format="no_think", config={"max_turns": 1000})
    texts = ("<answer>Left</answer>", "<answer>Right</answer>")
    deadline = time.monotonic() + limit
    with EnvClient(address, transport=transport, timeout=600, retries=3) as client:
        sid, n = None, 0
        print("ready", flush=True)
        next_at = time.monotonic()
        while not stop.is_set() and time.monotonic() < deadline:
            if sid is None:
                try:
                    (reply,) = client.create(options)
                    sid = reply.session_id
                except (CapacityError, SessionLost):  # full for a moment (a cap prober), or
                    stop.wait(1.0)  # the worker it was placed on was killed (soak)
                    continue
            stop.wait(max(0.0, next_at - time.monotonic()))
            if stop.is_set():
                break
            started = time.monotonic()
            next_at = started + every
            try:
                (reply,) = client.step([sid], [texts[n % 2]])
            except VisenvError as exc:  # e.g. SESSION_LOST: its worker was killed (soak)
                print(f"lost {started:.6f} {exc.code}", flush=True)
                sid = None
                continue
            print(f"step {started:.6f} {time.monotonic() - started:.6f}", flush=True)
            n += 1
            if reply.done:  # a new episode (not timed)
                try:
                    client.reset([sid])
                except VisenvError:
                    sid = None
        if sid is not None:
            client.close([sid])


class Probe:
    """A probe process (`probe_child`) and the steps it timed: (start, seconds)."""

    def __init__(self, transport: str, address: str, every: float = PROBE_EVERY) -> None:
        self.name = {"http": "REST", "grpc": "gRPC"}[transport]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--probe-child", transport,
               "--probe-address", address, "--probe-every", str(every)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT)  # fmt: skip
        self.steps: list[tuple[float, float]] = []
        self.lost: list[tuple[float, str]] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, *rest = line.split()
            if kind == "ready":
                self.ready.set()
            elif kind == "step":
                self.steps.append((float(rest[0]), float(rest[1])))
            elif kind == "lost":
                self.lost.append((float(rest[0]), rest[1]))
        self.ready.set()  # it ended

    def wait_ready(self, timeout: float = 120) -> None:
        if not self.ready.wait(timeout) or self.proc.poll() is not None:
            raise RuntimeError(f"the {self.name} probe did not start")

    def during(self, start: float, end: float) -> list[float]:
        """Seconds of the steps that overlapped [start, end]."""
        return [dt for t, dt in list(self.steps) if t <= end and t + dt >= start]

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def quantiles(xs: list[float]) -> tuple[int, float, float, float]:
    """n, p50, p99 and max in ms (a short window may hold a single probe: its value)."""
    if not xs:
        return 0, float("nan"), float("nan"), float("nan")
    ms = np.array(xs) * 1e3
    return len(xs), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), float(ms.max())


class PySpy:
    """`py-spy record` of a process and its children (idle samples too: where a thread
    waits) for the length of a `with` block (optional)."""

    def __init__(self, folder: str | None, pid: int, name: str) -> None:
        self.cmd = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            spy = Path(sys.executable).with_name("py-spy")
            self.cmd = [str(spy), "record", "-p", str(pid), "-r", "100", "-f", "raw", "--idle",
                        "--subprocesses", "-o",
                        str(Path(folder) / f"{name}.txt"), "--nonblocking"]  # fmt: skip

    def __enter__(self) -> PySpy:
        if self.cmd:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)  # fmt: skip
            time.sleep(1.0)  # attached
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cmd:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def batches(transports, sizes: list[int], probes: list[Probe], idle_s: float,
            spy_folder: str | None, server_pid: int) -> None:  # fmt: skip
    """Each size on each transport, the probes' latencies meanwhile; tables at the end."""
    rows: list[tuple[str, list[float], float, float, float]] = []  # label, per item, window

    def idle(label: str) -> None:
        t0 = time.monotonic()
        time.sleep(idle_s)
        rows.append((label, [], t0, time.monotonic(), float("nan")))

    idle("idle (before)")
    print(f"\nwall time per item, {ENV} (ms/item; lower is better, flat is linear)")
    print(f"{'transport':9} {'items':>6} {'create':>8} {'step':>8} {'close':>8}", flush=True)
    for size in sizes:
        for t in transports:  # alternating transports per size: both see the same load
            with PySpy(spy_folder, server_pid, f"{t.name}-{size}"):
                t0 = time.monotonic()
                ids, c = timed(t.create, size)
                _, s = timed(t.step, ids)
                _, x = timed(t.close, ids)
                t1 = time.monotonic()
            print(f"{t.name:9} {size:>6} {c / size * 1e3:>8.2f} {s / size * 1e3:>8.2f} "
                  f"{x / size * 1e3:>8.3f}", flush=True)  # fmt: skip
            rows.append((f"{t.name} {size} items", [c, s, x], t0, t1, c + s + x))
            time.sleep(1.0)  # the server settles; the probes' windows apart
    idle("idle (after)")

    print(f"\nprobe: one {PROBE_ENV} session stepped every {PROBE_EVERY} s by another client "
          "(SDK, own process), ms; target p99 <= 150 ms")  # fmt: skip
    head = "".join(f" | {p.name + ' probe':>13} {'p50':>6} {'p99':>6} {'max':>6}" for p in probes)
    print(f"{'while':22} {'batch s':>7}{head}")
    for label, _, t0, t1, took in rows:
        cells = ""
        for p in probes:
            n, p50, p99, worst = quantiles(p.during(t0, t1))
            cells += f" | {'n=' + str(n):>13} {p50:>6.1f} {p99:>6.1f} {worst:>6.1f}"
        print(f"{label:22} {took:>7.1f}{cells}")
    for p in probes:
        if p.lost:
            print(f"{p.name} probe: {len(p.lost)} failed steps: {p.lost[:5]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="512,2048,4096")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle probing")
    parser.add_argument("--py-spy", metavar="FOLDER",
                        help="record the server's API process with py-spy during each batch")  # fmt: skip
    parser.add_argument("--startup-envs", default="",
                        help="also time a start-up serving these envs (comma-separated)")  # fmt: skip
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a VISENV_* setting of the server (repeatable), e.g. "
                        "VISENV_PIECE_ITEMS='{\"*\": 4}'")  # fmt: skip
    parser.add_argument("--probe-child", choices=("http", "grpc"), help=argparse.SUPPRESS)
    parser.add_argument("--probe-address", help=argparse.SUPPRESS)
    parser.add_argument("--probe-every", type=float, default=PROBE_EVERY, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe_child:
        probe_child(args.probe_child, args.probe_address, args.probe_every, PROBE_LIMIT)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    server_env = dict(kv.split("=", 1) for kv in args.server_env)
    server = Server(f"{ENV},{PROBE_ENV}", args.workers,
                    ["--max-sessions", str(2 * max(sizes) + 16)], server_env)  # fmt: skip
    probes: list[Probe] = []
    try:
        first = server.first_answer()
        print(f"start-up ({ENV}): address printed {server.printed_at:.2f} s, "
              f"first answer {first:.2f} s, all ready {server.all_ready():.2f} s")  # fmt: skip
        rest, grpc_ = Rest(server.url), Grpc(server.grpc)
        rest.close(rest.create(2 * args.workers))  # each worker's first env pays its imports
        probes = [Probe("http", server.url), Probe("grpc", server.grpc)]
        for p in probes:
            p.wait_ready()
        time.sleep(2.0)  # the probes' first steps (their sessions' creates) are behind them
        batches([rest, grpc_], sizes, probes, args.idle, args.py_spy, server.server.proc.pid)
    finally:
        for p in probes:
            p.stop()
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
