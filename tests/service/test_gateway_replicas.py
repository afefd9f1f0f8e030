"""Gateway replicas with no memory of sessions, against real processes: two upstream
servers and two gateways. A session made through one gateway is stepped, forked and
framed through the other; a gateway SIGKILLed mid-episode and restarted routes every
session again; a forged id is NOT_FOUND and connects nowhere; an upstream unreachable
for a moment answers UNAVAILABLE and the retried step is not applied twice."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from env_server.testing.launcher import launch_servers

OPTIONS = {"env": "tiny", "format": "no_think", "config": {"length": 32, "max_turns": 1000}}
MOVES = ("<answer>Left</answer>", "<answer>Right</answer>")


def step(http: httpx.Client, sid: str, index: int) -> httpx.Response:
    return http.post(
        f"/v1/sessions/{sid}/step", json={"step_index": index, "response": MOVES[index % 2]}
    )


@pytest.fixture
def cluster():
    """Two upstreams (nodes light-0, light-1) and two gateways in front of both."""
    up0, up1 = launch_servers(
        {"workers": 1, "envs": "tiny", "extra_env": {"VISENV_NODE_ID": "light-0"}},
        {"workers": 1, "envs": "tiny", "extra_env": {"VISENV_NODE_ID": "light-1"}},
    )
    gateways = launch_servers(*[{"envs": None, "upstreams": [up0.grpc, up1.grpc]}] * 2)
    servers = [up0, up1, *gateways]
    yield servers
    for server in servers:
        server.stop()


def gateway_config(up0, up1) -> dict:
    return {"envs": None, "upstreams": [up0.grpc, up1.grpc]}


def test_any_gateway_serves_any_session_and_a_restarted_one_too(cluster):
    up0, up1, gw_a, gw_b = cluster
    with gw_a.client() as a, gw_b.client() as b:
        made = a.post(
            "/v1/batch/create", json={"items": [{**OPTIONS, "seed": s} for s in range(6)]}
        )
        sids = [r["reply"]["session_id"] for r in made.json()["results"]]
        nodes = {sid.split(".")[1] for sid in sids}
        assert nodes == {"light-0", "light-1"}  # spread over both upstreams

        # stepped (batch) through the other gateway, which never saw them made
        items = [{"session_id": s, "step_index": 0, "response": MOVES[0]} for s in sids]
        stepped = b.post("/v1/batch/step", json={"items": items}).json()["results"]
        assert [r["reply"]["turn"] for r in stepped] == [1] * 6
        # a retry of the same step through the first gateway is answered from memory
        again = a.post("/v1/batch/step", json={"items": items}).json()["results"]
        assert [r["reply"]["turn"] for r in again] == [1] * 6

        forks = b.post(f"/v1/sessions/{sids[0]}/fork", json={"n": 2}).json()
        fork_ids = [f["session_id"] for f in forks["replies"]]
        assert all(f.split(".")[1] == sids[0].split(".")[1] for f in fork_ids)
        assert step(a, fork_ids[0], 1).json()["turn"] == 2  # the fork, through gateway A
        png = a.get(f"/v1/sessions/{sids[1]}/frame.png")
        assert png.status_code == 200 and png.content[:4] == b"\x89PNG"

        health = b.get("/health").json()
        assert {(u["node"], u["up"]) for u in health["upstreams"]} == {
            ("light-0", True),
            ("light-1", True),
        }
        gauge = f'visenv_gateway_upstream_up{{address="{up1.grpc}",node="light-1"}} 1.0'
        assert gauge in b.get("/metrics").text

    # gateway A killed mid-episode while a client keeps stepping through B
    turns = dict.fromkeys(sids, 1)
    errors: list[str] = []
    stop = threading.Event()

    def keep_stepping() -> None:
        with gw_b.client() as http:
            while not stop.is_set():
                for sid in sids:
                    r = step(http, sid, turns[sid])
                    if r.status_code != 200:
                        errors.append(r.text)
                        return
                    assert r.json()["turn"] == turns[sid] + 1
                    turns[sid] += 1

    with ThreadPoolExecutor(1) as pool:
        stepping = pool.submit(keep_stepping)
        time.sleep(0.5)
        gw_a.kill()
        (gw_a2,) = launch_servers(gateway_config(up0, up1))
        try:
            time.sleep(0.5)
            stop.set()
            stepping.result(timeout=60)
            assert errors == [] and min(turns.values()) > 2
            with gw_a2.client() as a2:  # the restarted gateway routes every session
                for sid in sids:
                    r = step(a2, sid, turns[sid])
                    assert r.status_code == 200 and r.json()["turn"] == turns[sid] + 1
                    turns[sid] += 1
        finally:
            gw_a2.stop()
    # the upstreams' own count: every step applied once, none lost
    for sid in sids:
        upstream = up0 if sid.split(".")[1] == "light-0" else up1
        with upstream.client() as direct:
            got = direct.get(f"/v1/sessions/{sid}").json()
            assert (got["step_index"], got["turn"]) == (turns[sid], turns[sid])


def test_a_forged_id_is_not_found_and_connects_nowhere(cluster):
    up0, _, gw_a, _ = cluster
    with socket.socket() as bait, gw_a.client() as http:
        bait.bind(("127.0.0.1", 0))
        bait.listen(8)
        bait.setblocking(False)
        port = bait.getsockname()[1]
        real = http.post("/v1/sessions", json={**OPTIONS, "seed": 1}).json()["session_id"]
        key, node, boot = real.split(".")
        forged = [
            f"{key}.localhost.{boot}",  # a node no upstream is
            f"{key}.127-0-0-1-{port}.{boot}",
            f"{key}.127.0.0.1:{port}",  # not an id at all
            f"s-{port}",
        ]
        for sid in forged:
            for r in (http.get(f"/v1/sessions/{sid}"), step(http, sid, 0)):
                assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND", r.text
        # the right node but another boot: a session of a process that is gone
        lost = http.get(f"/v1/sessions/{key}.{node}.00000000").json()
        assert lost["error"]["code"] == "SESSION_LOST"
        with pytest.raises(BlockingIOError):
            bait.accept()
        addresses = {u["address"] for u in http.get("/health").json()["upstreams"]}
        assert addresses == {up0.grpc, cluster[1].grpc}


class CuttableProxy:
    """A TCP proxy that can swallow what the upstream sends back and then cut every
    connection: a network fault between gateway and upstream, which no real component
    produces on demand."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.swallow = False
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:  # nothing there (yet): as if the upstream refused
                client.close()
                continue
            self.conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, back: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if not (back and self.swallow):
                    dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        for s in self.conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.conns.clear()
        self.swallow = False

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_an_upstream_unreachable_for_a_moment_answers_unavailable_and_no_step_twice(
    start_visenv_server,
):
    upstream = start_visenv_server(workers=1, envs="tiny", extra_env={"VISENV_NODE_ID": "light-0"})
    proxy = CuttableProxy(upstream.grpc)
    try:
        # the node pinned by name (as on Kubernetes): reached through the proxy only
        gateway = start_visenv_server(envs=None, upstreams=[f"light-0={proxy.address}"])
        with gateway.client() as http, upstream.client() as direct, ThreadPoolExecutor(1) as pool:
            sid = http.post("/v1/sessions", json={**OPTIONS, "seed": 2}).json()["session_id"]
            assert step(http, sid, 0).json()["turn"] == 1

            proxy.swallow = True  # the step reaches the upstream; its answer does not come back
            pending = pool.submit(step, http, sid, 1)
            deadline = time.monotonic() + 20
            while direct.get(f"/v1/sessions/{sid}").json()["turn"] != 2:
                assert time.monotonic() < deadline, "the step never reached the upstream"
                time.sleep(0.05)
            proxy.cut()
            moment = pending.result(timeout=20)
            assert moment.status_code == 503 and moment.json()["error"]["code"] == "UNAVAILABLE"

            # the client retries the same step: answered from the upstream's memory
            deadline = time.monotonic() + 20
            while (retry := step(http, sid, 1)).status_code == 503:
                assert time.monotonic() < deadline, retry.text
                time.sleep(0.1)
            assert retry.status_code == 200 and retry.json()["turn"] == 2
            assert direct.get(f"/v1/sessions/{sid}").json()["turn"] == 2  # applied once
            assert step(http, sid, 2).json()["turn"] == 3
    finally:
        proxy.close()


def test_a_gateway_names_bad_fields_as_a_server_does(cluster):
    up0, _, gw_a, _ = cluster
    bad = [
        ("/v1/batch/create", {"items": [{**OPTIONS, "seed": 1}, {**OPTIONS, "seed": "x"}]}),
        ("/v1/batch/step", {"items": [{"session_id": "s-1", "step_index": -1, "response": ""}]}),
        ("/v1/batch/fork", {"items": [{"session_id": "s-1", "n": 0}]}),
        ("/v1/batch/reset", {"items": [{"session_id": "s-1", "seed": "x"}]}),
    ]
    with up0.client() as direct, gw_a.client() as http:
        for path, body in bad:
            fields = [
                [
                    r["error"]["field"]
                    for r in c.post(path, json=body).json()["results"]
                    if not r["ok"]
                ]
                for c in (direct, http)
            ]
            assert fields[0] == fields[1] and fields[0][0] in ("seed", "step_index", "n"), fields
        single = [
            c.post("/v1/sessions", json={**OPTIONS, "seed": "x"}).json() for c in (direct, http)
        ]
        assert single[0]["error"]["field"] == single[1]["error"]["field"] == "seed"


def test_sessions_of_a_restarted_upstream_are_lost_and_new_ones_go_on(start_visenv_server):
    """The upstream's process replaced under the same name (a pod re-created): the old
    process's sessions answer SESSION_LOST, not NOT_FOUND, through a gateway that saw
    nothing happen."""
    node = {"workers": 1, "envs": "tiny", "extra_env": {"VISENV_NODE_ID": "light-0"}}
    first = start_visenv_server(**node)
    proxy = CuttableProxy(first.grpc)  # the upstream's stable name
    try:
        gateway = start_visenv_server(envs=None, upstreams=[f"light-0={proxy.address}"])
        with gateway.client() as http:
            old = http.post("/v1/sessions", json={**OPTIONS, "seed": 4}).json()["session_id"]
            first.kill()
            second = start_visenv_server(**node)
            host, port = second.grpc.rsplit(":", 1)
            proxy.target = (host, int(port))
            proxy.cut()
            deadline = time.monotonic() + 20
            while (r := step(http, old, 0)).status_code == 503:
                assert time.monotonic() < deadline, r.text
                time.sleep(0.1)
            assert r.status_code == 410 and r.json()["error"]["code"] == "SESSION_LOST", r.text
            new = http.post("/v1/sessions", json={**OPTIONS, "seed": 4}).json()["session_id"]
            assert new.split(".")[1] == "light-0" and new.split(".")[2] != old.split(".")[2]
            assert step(http, new, 0).json()["turn"] == 1
    finally:
        proxy.close()


def test_the_sdk_retries_a_step_its_gateway_could_not_deliver_and_applies_it_once(
    start_visenv_server,
):
    """The SDK's own retry of an UNAVAILABLE item (what a user of EnvClient gets
    without writing a loop): the step reached the upstream, its answer was lost between
    gateway and upstream, the SDK sends the same step_index again and gets the reply."""
    from clients import EnvClient, SessionOptions

    upstream = start_visenv_server(workers=1, envs="tiny", extra_env={"VISENV_NODE_ID": "light-0"})
    proxy = CuttableProxy(upstream.grpc)
    try:
        gateway = start_visenv_server(envs=None, upstreams=[f"light-0={proxy.address}"])
        with EnvClient(gateway.grpc, retries=3, retry_wait=0.2) as client, \
                upstream.client() as direct, ThreadPoolExecutor(1) as pool:  # fmt: skip
            (first,) = client.create(SessionOptions(seed=2, **OPTIONS))
            sid = first.session_id
            client.step(sid, MOVES[0])
            proxy.swallow = True  # the next step reaches the upstream; its answer does not return
            pending = pool.submit(client.step, sid, MOVES[1])
            deadline = time.monotonic() + 20
            while direct.get(f"/v1/sessions/{sid}").json()["turn"] != 2:
                assert time.monotonic() < deadline, "the step never reached the upstream"
                time.sleep(0.05)
            proxy.cut()
            (reply,) = pending.result(timeout=30)
            assert reply.turn == 2 and reply.step_index == 2
            assert direct.get(f"/v1/sessions/{sid}").json()["turn"] == 2  # applied once
            (after,) = client.step(sid, MOVES[0])
            assert after.turn == 3
    finally:
        proxy.close()
