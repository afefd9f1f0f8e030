"""A set of visenv servers on a real multi-node Ray cluster (conftest.py: a head without CPUs
and two worker nodes), driven as a user would: `visenv ray up|status|scale|down` in
subprocesses, the SDK by `ray://NAME` from another process and from this one.

The tests run in order over one set (starting servers costs most of the time on a small
machine): up and placement, the SDK from another process, status against what the SDK
holds, a killed server, scaling 2 -> 3 -> 1 with drain, a removed node, down. Each call
that could hang is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from clients import EnvClient, SessionOptions
from clients.errors import SessionLost, VisenvError

ray = pytest.importorskip("ray")

from env_server.ray import servers as ray_servers  # noqa: E402 (after the skip)

ROOT = Path(__file__).resolve().parents[2]
NAME = "t43"
ENVS = "sokoban,frozenlake"
MOVE = "<think>go</think><answer>Left</answer>"
pytestmark = pytest.mark.timeout(150)  # each test (pytest-timeout): none may hang CI


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`visenv ray ...` in its own process, against the cluster (RAY_ADDRESS)."""
    return subprocess.run(
        [sys.executable, "-m", "visenv_cli", "ray", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def status(kind: str = "server") -> list[dict[str, Any]]:
    """`visenv ray status --json`'s servers (or gateways), by index."""
    proc = cli("status", "--name", NAME, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["members"]
    return sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["index"])


def wait_status(check, timeout: float = 60) -> list[dict[str, Any]]:
    """`status()` once `check(rows)` holds (the set settles: a restart, a drain)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = status()
        if check(rows):
            return rows
        assert time.monotonic() < deadline, f"the set never settled: {rows}"
        time.sleep(0.5)


def bounded(fn, limit: float, *args, **kwargs):
    """fn's answer, and that it came within `limit` seconds (no call hangs)."""
    started = time.monotonic()
    out = fn(*args, **kwargs)
    took = time.monotonic() - started
    assert took < limit, f"{fn.__name__} took {took:.1f} s (limit {limit} s)"
    return out


def counts(client: EnvClient) -> dict[str, int]:
    out: dict[str, int] = {}
    for sid in client.session_ids:
        out[client.server_of(sid)] = out.get(client.server_of(sid), 0) + 1
    return out


@pytest.fixture(scope="module")
def ray_set(ray_cluster):
    """The set NAME: 2 servers of 1 CPU and 1 worker each and a gateway, started by
    `visenv ray up`."""
    proc = cli("up", "--name", NAME, "--servers", "2", "--cpus-per-server", "1",
               "--workers", "1", "--envs", ENVS, "--gateway", timeout=180)  # fmt: skip
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"set {NAME}: 2 server(s) (2 serving, 0 draining), 1 gateway(s)" in proc.stdout
        yield NAME
    finally:
        try:
            ray_servers.down(NAME)
        except ray_servers.SetError:
            pass  # the last test took it down


def test_up_puts_servers_on_different_nodes(ray_set, ray_cluster):
    rows = wait_status(lambda rows: all(r["health"] == "ok" for r in rows))
    assert [r["index"] for r in rows] == [0, 1]
    workers = {n.node_id for n in ray_cluster.worker_nodes}
    assert {r["ray_node"] for r in rows} == workers  # one on each worker node, none on the head
    for row in rows:  # what status says is what each server says of itself
        with EnvClient(row["grpc"]) as client:
            (health,) = client.status()
        assert row["sessions"] == health["sessions"] == 0
        assert row["draining"] is health["draining"] is False
        assert row["node_id"] == f"{NAME}-{row['index']}"


def test_the_sdk_in_another_process_finds_the_set_by_name(ray_set):
    script = textwrap.dedent(f"""
        import json
        from clients import EnvClient, SessionOptions
        with EnvClient("ray://{NAME}") as client:
            made = client.create([SessionOptions("sokoban", seed=s) for s in range(4)])
            ids = [r.session_id for r in made]
            steps = client.step(ids, [{MOVE!r}] * 4)
            steps = client.step(ids, [{MOVE!r}] * 4)
            print(json.dumps({{"servers": client.servers,
                               "used": sorted({{client.server_of(i) for i in ids}}),
                               "steps": [r.step_index for r in steps]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    addresses = [r["grpc"] for r in status()]
    assert sorted(out["servers"]) == sorted(addresses)
    assert out["used"] == sorted(addresses)  # sessions on both servers
    assert out["steps"] == [2, 2, 2, 2]
    assert [r["sessions"] for r in status()] == [0, 0]  # it closed them on leaving


def test_a_gateway_routes_clients_outside_to_the_set(ray_set):
    (gateway,) = status("gateway")
    servers = status()
    assert sorted(gateway["upstreams"]) == sorted(r["grpc"] for r in servers)
    with EnvClient(gateway["grpc"]) as client:  # one address, as a client outside would
        made = client.create([SessionOptions("sokoban", seed=s) for s in range(4)])
        ids = [r.session_id for r in made]
        assert [r.step_index for r in client.step(ids, [MOVE] * 4)] == [1] * 4
        assert [r["sessions"] for r in status()] == [2, 2]  # placed by load, upstream
    # the gateway follows every change of the set by restarting itself: the tests below
    # change the set often, on 2 cores, so it goes now
    ray.kill(ray.get_actor(f"{NAME}/gateway/0", namespace="visenv"), no_restart=True)


def test_status_counts_the_sessions_the_sdk_holds(ray_set):
    with EnvClient(f"ray://{NAME}") as client:
        client.create([SessionOptions("frozenlake", seed=s) for s in range(3)])
        held = counts(client)
        rows = status()
        assert {r["grpc"]: r["sessions"] for r in rows} == {
            r["grpc"]: held.get(r["grpc"], 0) for r in rows
        }
        assert sorted(held.values()) == [1, 2]
    assert [r["sessions"] for r in status()] == [0, 0]


def test_a_killed_server_comes_back_and_its_sessions_answer_session_lost(ray_set):
    with EnvClient(f"ray://{NAME}", refresh_s=1.0, timeout=20) as client:
        made = client.create([SessionOptions("sokoban", seed=s) for s in range(4)])
        ids = [r.session_id for r in made]
        before = status()
        victim = before[0]
        doomed = [i for i in ids if client.server_of(i) == victim["grpc"]]
        assert len(doomed) == 2
        os.kill(victim["pid"], signal.SIGKILL)  # the `visenv serve` process, workers after it
        killed = time.monotonic()

        steps = bounded(client.step, 15, ids, [MOVE] * 4, return_exceptions=True)
        for sid, result in zip(ids, steps, strict=True):
            if sid in doomed:
                assert isinstance(result, SessionLost), result
            else:
                assert not isinstance(result, VisenvError), result
        # new episodes go on, on servers that answer, while Ray brings the lost one back
        fresh = bounded(client.create, 30, [SessionOptions("sokoban", seed=9)] * 2)
        bounded(client.step, 15, [r.session_id for r in fresh], [MOVE] * 2)

        rows = wait_status(
            lambda rows: (
                len(rows) == 2 and rows[0]["health"] == "ok" and rows[0].get("pid") != victim["pid"]
            ),
            timeout=90,
        )
        print(f"replacement answered {time.monotonic() - killed:.1f} s after the kill")
        assert rows[0]["grpc"] != victim["grpc"]
        assert rows[0]["node_id"] == victim["node_id"]  # the same name, a new boot
        assert rows[1]["pid"] == before[1]["pid"]  # the other one never stopped
        assert sorted(bounded(client.refresh, 10)) == sorted(r["grpc"] for r in rows)
        # the replacement, the least loaded, takes the next sessions
        more = bounded(client.create, 30, [SessionOptions("frozenlake", seed=1)] * 2)
        assert {client.server_of(r.session_id) for r in more} == {rows[0]["grpc"]}
        bounded(client.step, 15, [r.session_id for r in more], [MOVE] * 2)


def test_scaling_2_3_1_drains_without_losing_a_session(ray_set):
    failed: list[Any] = []

    def step_all(client: EnvClient) -> None:
        results = bounded(
            client.step, 20, client.session_ids, [MOVE] * len(client.session_ids),
            return_exceptions=True,
        )  # fmt: skip
        failed.extend(r for r in results if isinstance(r, VisenvError))

    with EnvClient(f"ray://{NAME}", refresh_s=1.0, timeout=30) as client:
        client.create([SessionOptions("sokoban", seed=s) for s in range(4)])
        proc = cli("scale", "--name", NAME, "--servers", "3", timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = wait_status(lambda rows: len(rows) == 3 and all(r["health"] == "ok" for r in rows))
        assert [r["draining"] for r in rows] == [False] * 3
        assert sorted(client.refresh()) == sorted(r["grpc"] for r in rows)
        client.create([SessionOptions("sokoban", seed=s) for s in range(2)])
        held = counts(client)
        assert held.get(rows[2]["grpc"]) == 2  # the new server, the least loaded
        step_all(client)

        proc = cli("scale", "--name", NAME, "--servers", "1")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "draining [1, 2]" in proc.stdout
        rows = status()
        assert [r["draining"] for r in rows] == [False, True, True]
        assert [r["sessions"] for r in rows] == [held.get(r["grpc"], 0) for r in rows]
        # the drained ones serve their sessions on; new ones go to the one left serving
        step_all(client)
        new = bounded(client.create, 20, [SessionOptions("frozenlake", seed=s) for s in range(3)])
        assert {client.server_of(r.session_id) for r in new} == {rows[0]["grpc"]}
        step_all(client)
        # a drained server stops once its last session is closed, the others go on
        client.close([s for s in client.session_ids if client.server_of(s) == rows[1]["grpc"]])
        left = wait_status(lambda now: [r["index"] for r in now] == [0, 2])
        assert left[1]["draining"] and left[1]["sessions"] == held[rows[2]["grpc"]]
        step_all(client)
        client.close([s for s in client.session_ids if client.server_of(s) == rows[2]["grpc"]])
        left = wait_status(lambda now: [r["index"] for r in now] == [0])
        assert not left[0]["draining"]
        assert left[0]["sessions"] == len(client.session_ids)
        step_all(client)
    assert failed == []  # no session lost, no call failed


def test_a_removed_node_takes_its_server_elsewhere(ray_set, ray_cluster):
    (row,) = status()
    node = next(n for n in ray_cluster.worker_nodes if n.node_id == row["ray_node"])
    with EnvClient(f"ray://{NAME}", refresh_s=1.0, timeout=60) as client:
        (made,) = client.create(SessionOptions("sokoban", seed=3))
        ray_cluster.remove_node(node, allow_graceful=False)
        removed = time.monotonic()
        while True:  # its server goes down with the node's worker processes, in a moment
            (lost,) = bounded(client.step, 15, made.session_id, MOVE, return_exceptions=True)
            if isinstance(lost, VisenvError):
                break
            assert time.monotonic() - removed < 30, "the server outlived its node"
            time.sleep(0.5)
        assert isinstance(lost, SessionLost), lost
        # the next episode waits (within the client's timeout) for the server Ray brings back
        (again,) = bounded(client.create, 60, SessionOptions("sokoban", seed=3))
        bounded(client.step, 15, again.session_id, MOVE)
    (back,) = wait_status(lambda rows: len(rows) == 1 and rows[0]["health"] == "ok")
    assert back["ray_node"] != node.node_id


def test_down_stops_every_server(ray_set):
    pids = [r["pid"] for r in status()]
    proc = cli("down", "--name", NAME)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = cli("status", "--name", NAME)
    assert proc.returncode == 1 and "no set named" in proc.stderr
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in names if n.startswith(f"{NAME}/")]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "a server outlived `visenv ray down`"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
