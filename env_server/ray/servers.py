"""A set of visenv servers on a Ray cluster: one actor per `visenv serve` process.

A set NAME is, in the Ray namespace `visenv`, the named detached actors

    NAME/set            holds the set's `SetSpec` (no CPU)
    NAME/server/<i>     `ServerActor`: one `visenv serve` and its workers, on `num_cpus`
                        (+ GPUs, custom resources, a node label), spread over the nodes
    NAME/gateway/<j>    the same actor running `visenv serve --upstream ...` over the set

so any driver or actor of the cluster finds the set by its name (clients/discovery.py
reads the `NAME/server/` actors). Each server's node id (in its session ids) is
`NAME-<i>`, and a new process has a new boot: sessions of a server Ray restarted answer
SESSION_LOST, never another server's state.

- The server process lives and dies with its actor: it is killed when the actor's
  process goes (PR_SET_PDEATHSIG), and the actor exits when its server exits, so Ray
  restarts both (`max_restarts`, unlimited by default) on any node with room.
- `scale` adds servers (new indices) or drains the newest: a drained server takes no new
  sessions (SIGUSR1: `EnvService.drain`), serves its open ones to the end, then stops and
  its actor exits for good; one that dies while draining is not brought back (the set
  actor remembers which it drained).
- A gateway follows the set: when a server appears at a new address (added, or restarted)
  it restarts its own process on the same ports with the set's current servers (gateways
  hold no session state; the SDK retries a call cut by it). A server that went away
  needs no restart: the gateway finds it unreachable, and its sessions lost, by itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import ray
from ray.exceptions import GetTimeoutError, RayError

from env_server.testing.launcher import VisenvServer, launch_server
from visenv.ray_names import NAME, NAMESPACE, member, member_index, set_actor

STRATEGIES = ("SPREAD", "DEFAULT")
FOLLOW_S = 2.0  # how often a gateway re-reads the set


class SetError(RuntimeError):
    """A set operation that cannot be done, with what to do instead."""


@dataclass
class SetSpec:
    """How each server of a set is started and placed."""

    name: str
    cpus_per_server: float = 1.0
    workers: int | None = None  # worker processes per server; default: its whole CPUs (>= 1)
    envs: str | None = None  # comma-separated; default: every one available
    gpus_per_server: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)  # Ray custom resources
    label_selector: dict[str, str] = field(default_factory=dict)  # Ray node labels
    strategy: str = "SPREAD"
    max_restarts: int = -1  # -1: Ray restarts a dead server forever
    serve_args: list[str] = field(default_factory=list)  # more `visenv serve` flags
    gateway_cpus: float = 0.5

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise SetError(
                f"set name {self.name!r}: lower-case letters, digits and '-', at most 42 "
                "(it names each server, NAME-<i>, in its session ids)"
            )
        if self.strategy not in STRATEGIES:
            raise SetError(f"strategy {self.strategy!r}: one of {', '.join(STRATEGIES)}")
        if self.cpus_per_server <= 0:
            raise SetError(f"cpus_per_server must be > 0, not {self.cpus_per_server}")

    @property
    def server_workers(self) -> int:
        return self.workers or max(1, int(self.cpus_per_server))


class SetActor:
    """NAME/set: the spec `scale` starts new servers with, and which servers it drained (so
    that one Ray restarts while draining ends instead of serving again)."""

    def __init__(self, spec: SetSpec) -> None:
        self._spec = spec
        self._drained: set[int] = set()

    def spec(self) -> SetSpec:
        return self._spec

    def mark_drained(self, indices: list[int]) -> None:
        self._drained.update(indices)

    def is_drained(self, index: int) -> bool:
        return index in self._drained


class ServerActor:
    """One `visenv serve` (a server, or with `gateway` a gateway over the set)."""

    def __init__(self, spec: SetSpec, index: int, gateway: bool = False) -> None:
        self.spec, self.index, self.gateway = spec, index, gateway
        self.kind = "gateway" if gateway else "server"
        self.started_at = time.time()  # this actor's (re)start
        self.serve_took = 0.0  # seconds its `visenv serve` took to answer
        self.ip = ray.util.get_node_ip_address()
        self.node_id = f"{spec.name}-gw-{index}" if gateway else f"{spec.name}-{index}"
        self.ray_node = ray.get_runtime_context().get_node_id()
        self.draining = False
        self.upstreams: list[str] = []
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self.server: VisenvServer | None = None
        # the server is started, watched and restarted by one long-lived thread: its parent
        # thread must outlive it (PR_SET_PDEATHSIG fires when that thread ends)
        threading.Thread(target=self._own, name="visenv-server", daemon=True).start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    # ---- the process ------------------------------------------------------------------
    def _launch(self, ports: tuple[str, str] | None = None) -> VisenvServer:
        args = ["--host", self.ip, *self.spec.serve_args]
        if ports is not None:  # a gateway restarted with new upstreams keeps its ports
            args += ["--port", ports[0], "--grpc-port", ports[1]]
        if self.gateway:
            return launch_server(
                workers=None, envs=None, upstreams=self.upstreams, args=args,
                extra_env={"VISENV_NODE_ID": self.node_id}, inherit_env=True,
                ready="answers", timeout=120, die_with_parent=True,
            )  # fmt: skip
        return launch_server(
            workers=self.spec.server_workers, envs=self.spec.envs, args=args,
            extra_env={"VISENV_NODE_ID": self.node_id}, inherit_env=True, ready="answers",
            timeout=600, die_with_parent=True,
        )  # fmt: skip

    def _own(self) -> None:
        if not self.gateway and self._drained_before():
            self._end_for_good()  # restarted by Ray after `scale` drained it: not wanted
        try:
            if self.gateway:
                self.upstreams = self._wait_for_upstreams()
            self.server = self._launch()
            self.serve_took = time.time() - self.started_at
        except BaseException as exc:  # the actor's constructor raises it
            self._start_error = exc
            self._started.set()
            return
        self._started.set()
        followed = time.monotonic()
        while not self._stopping.is_set():
            if self.server.proc.poll() is not None:
                if self._stopping.is_set():
                    return
                if self.draining:  # it was to stop anyway (its sessions are lost)
                    self._end_for_good()
                os._exit(1)  # the server died: this actor dies too, and Ray restarts both
            if self.gateway and time.monotonic() - followed > FOLLOW_S:
                followed = time.monotonic()
                try:
                    self._follow()
                except BaseException:  # no gateway process now: Ray restarts the actor
                    os._exit(1)
            time.sleep(0.1)

    def _drained_before(self) -> bool:
        try:
            holder = ray.get_actor(set_actor(self.spec.name), namespace=NAMESPACE)
            return bool(_value(holder.is_drained.remote(self.index), 30))
        except Exception:  # no set actor to ask (being taken down): serve
            return False

    def _end_for_good(self) -> None:
        """End this actor without a restart (never returns)."""
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        time.sleep(60)  # the kill ends this process
        os._exit(0)

    def _wait_for_upstreams(self) -> list[str]:
        deadline = time.monotonic() + 120
        while not (found := server_addresses(self.spec.name)):
            if time.monotonic() > deadline:
                raise SetError(f"no server of set {self.spec.name!r} answers to route to")
            time.sleep(0.5)
        return found

    def _follow(self) -> None:
        """Restart the gateway with the set's current servers, on the same ports, when one
        of them is new to it."""
        found = server_addresses(self.spec.name, timeout=5)
        if not found or set(found) <= set(self.upstreams):
            return
        assert self.server is not None and self.server.grpc is not None
        ports = (self.server.http.rsplit(":", 1)[1], self.server.grpc.rsplit(":", 1)[1])
        self.server.stop()
        self.upstreams = found
        self.server = self._launch(ports)

    # ---- remote methods -----------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        assert self.server is not None
        return {
            "name": member(self.spec.name, self.kind, self.index),
            "kind": self.kind,
            "index": self.index,
            "node_id": self.node_id,
            "ray_node": self.ray_node,
            "ip": self.ip,
            "grpc": self.server.grpc,
            "http": self.server.url,
            "pid": self.server.proc.pid,
            "actor_pid": os.getpid(),
            "draining": self.draining,
            "upstreams": list(self.upstreams),
            "started_at": self.started_at,
            "serve_start_s": round(self.serve_took, 2),
        }

    async def health(self) -> dict[str, Any]:
        assert self.server is not None
        async with httpx.AsyncClient(timeout=5) as http:
            return (await http.get(self.server.url + "/health")).json()

    async def drain(self) -> None:
        """No new sessions; stop (and end this actor for good) once the last one is closed."""
        if self.draining:
            return
        assert self.server is not None
        self.draining = True
        os.kill(self.server.proc.pid, signal.SIGUSR1)
        self._drained = asyncio.get_running_loop().create_task(self._stop_when_empty())

    async def _stop_when_empty(self) -> None:
        while True:
            try:
                health = await self.health()
                if health.get("draining") and health.get("sessions") == 0:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        await self.stop()
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def stop(self) -> None:
        self._stopping.set()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


# ---- the driver's side ----------------------------------------------------------------------
def connect(address: str | None = None) -> None:
    """Join the cluster at `address`, else RAY_ADDRESS, else the one on this machine."""
    if not ray.is_initialized():
        ray.init(
            address=address or os.environ.get("RAY_ADDRESS") or "auto",
            namespace=NAMESPACE,
            log_to_driver=False,
            logging_level="WARNING",
        )


def members(name: str, kind: str) -> dict[int, Any]:
    """The live actors `NAME/<kind>/<i>` by index."""
    found = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        index = member_index(name, kind, actor["name"])
        if actor["namespace"] == NAMESPACE and index is not None:
            try:
                found[index] = ray.get_actor(actor["name"], namespace=NAMESPACE)
            except ValueError:  # gone since it was listed
                continue
    return found


def _value(ref: Any, timeout: float) -> Any:
    """ray.get(ref) without ray.get: inside an async actor (a gateway's or server's own
    thread asks the set) ray.get warns that it blocks the event loop, which it does not."""
    return ref.future().result(timeout=timeout)


def _infos(actors: dict[int, Any], timeout: float) -> dict[int, dict[str, Any] | None]:
    """Each actor's `info`, None for one that does not answer within `timeout`
    (restarting, or still starting)."""
    refs = {i: a.info.remote() for i, a in actors.items()}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    done = set(ready)
    out: dict[int, dict[str, Any] | None] = {}
    for i, ref in refs.items():
        try:
            out[i] = _value(ref, 1) if ref in done else None
        except (RayError, TimeoutError):  # it died meanwhile (Ray is restarting it)
            out[i] = None
    return out


def server_addresses(name: str, timeout: float = 10.0) -> list[str]:
    """The gRPC addresses of the set's servers that answer (draining ones included:
    their sessions are reached through them)."""
    infos = _infos(members(name, "server"), timeout)
    return [i["grpc"] for _, i in sorted(infos.items()) if i is not None and i["grpc"]]


def _spec(name: str) -> SetSpec:
    try:
        holder = ray.get_actor(set_actor(name), namespace=NAMESPACE)
    except ValueError:
        raise SetError(f"no set named {name!r} on this cluster (visenv ray up)") from None
    return ray.get(holder.spec.remote(), timeout=30)


def _start(spec: SetSpec, indices: range, gateway: bool, timeout: float) -> None:
    kind = "gateway" if gateway else "server"
    options: dict[str, Any] = {
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "max_restarts": spec.max_restarts,
        "max_concurrency": 16,  # health and info answer while a drain waits
        "scheduling_strategy": spec.strategy,
    }
    if gateway:
        options["num_cpus"] = spec.gateway_cpus
    else:
        options |= {"num_cpus": spec.cpus_per_server, "num_gpus": spec.gpus_per_server}
        if spec.resources:
            options["resources"] = dict(spec.resources)
        if spec.label_selector:
            options["label_selector"] = dict(spec.label_selector)
    actors = [
        ray.remote(ServerActor)
        .options(name=member(spec.name, kind, i), **options)
        .remote(spec, i, gateway)
        for i in indices
    ]
    try:
        ray.get([a.info.remote() for a in actors], timeout=timeout)
    except GetTimeoutError:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        raise SetError(
            f"{len(actors)} {kind}(s) of set {spec.name!r} did not all answer within "
            f"{timeout:.0f} s: not enough free CPUs/GPUs/resources on the cluster for "
            f"{spec.cpus_per_server} CPUs each? (ray status); they were removed"
        ) from None


def up(spec: SetSpec, servers: int, gateways: int = 0, timeout: float = 600.0) -> None:
    """Start a new set of `servers` servers (and `gateways` gateways); return when all answer."""
    if servers < 1:
        raise SetError("a set needs at least one server")
    try:
        ray.get_actor(set_actor(spec.name), namespace=NAMESPACE)
    except ValueError:
        pass
    else:
        raise SetError(f"set {spec.name!r} is up already: visenv ray scale, or down first")
    ray.remote(SetActor).options(
        name=set_actor(spec.name), namespace=NAMESPACE, lifetime="detached", num_cpus=0,
        max_restarts=-1,
    ).remote(spec)  # fmt: skip
    try:
        _start(spec, range(servers), False, timeout)
        if gateways:
            _start(spec, range(gateways), True, timeout)
    except BaseException:
        down(spec.name)
        raise


def scale(name: str, servers: int, timeout: float = 600.0) -> dict[str, list[int]]:
    """Grow the set to `servers` serving servers (new indices) or drain the newest ones
    down to it; answers the indices started and drained."""
    if servers < 1:
        raise SetError("a set keeps at least one server (visenv ray down removes it)")
    spec = _spec(name)
    current = members(name, "server")
    infos = _infos(current, timeout=30)
    serving = sorted(i for i in current if not (infos[i] or {}).get("draining"))
    if servers > len(serving):
        first = max(current, default=-1) + 1
        new = range(first, first + servers - len(serving))
        _start(spec, new, False, timeout)
        return {"started": list(new), "drained": []}
    drained = serving[servers:]
    holder = ray.get_actor(set_actor(name), namespace=NAMESPACE)
    ray.get(holder.mark_drained.remote(drained), timeout=30)
    ray.get([current[i].drain.remote() for i in drained], timeout=60)
    return {"started": [], "drained": drained}


def status(name: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """One row per server and gateway: where it runs, its address, sessions and health."""
    _spec(name)
    rows = []
    for kind in ("server", "gateway"):
        actors = members(name, kind)
        # an actor that is up answers info() at once; one Ray is restarting answers only
        # once its server is back: not worth waiting for
        infos = _infos(actors, min(timeout, 3.0))
        # each server's own /health, asked of all at once (through its actor, on its node)
        asked = {i: actors[i].health.remote() for i, info in infos.items() if info is not None}
        ray.wait(list(asked.values()), num_returns=len(asked), timeout=timeout)
        for i in sorted(actors):
            info = infos[i]
            row: dict[str, Any] = {"kind": kind, "index": i, "name": member(name, kind, i)}
            if info is None:
                rows.append(row | {"health": "not answering (starting or restarting)"})
                continue
            row |= info
            try:
                health = ray.get(asked[i], timeout=0.01)
            except Exception as exc:  # the actor answers, its server does not
                row["health"] = f"server unreachable: {type(exc).__name__}"
            else:
                row |= {
                    "health": health.get("status"),
                    "sessions": health.get("sessions"),
                    "draining": bool(health.get("draining", False)),
                }
            rows.append(row)
    return rows


def down(name: str) -> int:
    """Stop every server and gateway of the set and forget it; answers how many."""
    actors = [*members(name, "gateway").values(), *members(name, "server").values()]
    stops = [a.stop.remote() for a in actors]
    ray.wait(stops, num_returns=len(stops), timeout=30)
    for actor in actors:
        ray.kill(actor, no_restart=True)
    try:
        ray.kill(ray.get_actor(set_actor(name), namespace=NAMESPACE), no_restart=True)
    except ValueError:
        if not actors:
            raise SetError(f"no set named {name!r} on this cluster") from None
    return len(actors)
