"""Connection limits: slow-header, slow-body and silent connections are closed after their
timeouts, a connection past the cap is refused cleanly (503 UNAVAILABLE), and a normal
client is served all along. Bounded: every loop stops by itself within a minute."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx

LIMITS = {
    "VISENV_HEADER_TIMEOUT": "2",
    "VISENV_BODY_TIMEOUT": "2",
    "VISENV_KEEP_ALIVE_TIMEOUT": "2",
    "VISENV_MAX_CONNECTIONS": "40",
}


def _connect(server) -> socket.socket:
    host, port = server.http.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.settimeout(10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (at most 10 s)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _dribble(sock: socket.socket, data: bytes, stop: threading.Event) -> None:
    """Send `data` a byte a second (a slow-loris) until the server closes or `stop`."""
    for byte in data:
        if stop.wait(1.0):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return  # closed by the server


def test_slow_loris_is_closed_while_a_normal_client_is_served(start_visenv_server):
    server = start_visenv_server(workers=1, envs="sokoban", extra_env=LIMITS)
    stop = threading.Event()
    silent = [_connect(server) for _ in range(10)]
    slow_headers = [_connect(server) for _ in range(10)]
    slow_bodies = [_connect(server) for _ in range(10)]
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 60 + b"\r\n\r\n"
    body_head = (
        b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n{"
    )
    threads = [threading.Thread(target=_dribble, args=(s, head, stop)) for s in slow_headers]
    for sock in slow_bodies:
        sock.sendall(body_head)
        threads.append(threading.Thread(target=_dribble, args=(sock, b" " * 99, stop)))
    for thread in threads:
        thread.start()
    served = 0
    try:
        with server.client() as http:
            sid = http.post("/v1/sessions", json={"env": "sokoban", "seed": 1}).json()["session_id"]  # fmt: skip
            started = time.monotonic()
            while time.monotonic() - started < 4:  # past every timeout, the client is served
                got = http.get(f"/v1/sessions/{sid}")
                assert got.status_code == 200, got.text
                served += 1
            # every slow connection was answered 408 naming what was late, then closed
            for sock, part in [(s, "headers") for s in silent + slow_headers] + [
                (s, "body") for s in slow_bodies
            ]:
                reply = _read_all(sock)
                assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
                error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
                assert error["field"] == part, error
            # at the cap, a new connection is refused cleanly, and served again below it
            held = [_connect(server) for _ in range(45)]
            try:
                refused = 0
                for sock in held[-5:]:
                    reply = _read_all(sock)
                    if reply.startswith(b"HTTP/1.1 503 "):
                        refused += 1
                        error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
                        assert error["code"] == "UNAVAILABLE", error
                assert refused >= 4, refused  # (the client's own pooled connection counts)
            finally:
                for sock in held:
                    sock.close()
            deadline = time.monotonic() + 20
            while True:  # the held ones are gone (closed by us), so there is room again
                try:
                    assert http.get("/health").status_code == 200
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            http.delete(f"/v1/sessions/{sid}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        for sock in silent + slow_headers + slow_bodies:
            sock.close()
    assert served > 0


def test_garbage_requests_do_not_flood_the_log(start_visenv_server):
    """uvicorn logs "Invalid HTTP request received." per connection on its own handlers;
    they are held to the server's log burst too (VISENV_LOG_BURST), and the server goes on."""
    server = start_visenv_server(workers=1, envs="sokoban", extra_env={"VISENV_LOG_BURST": "3"})
    for _ in range(30):
        with _connect(server) as sock:
            sock.sendall(b"GARBAGE\x00\x01 /x HTTP/9\r\n\r\n")
            assert _read_all(sock).startswith(b"HTTP/1.1 400 ")
    with server.client() as http:
        assert http.get("/health").status_code == 200
    time.sleep(0.3)
    logged = sum("Invalid HTTP request" in line for line in server.output)
    assert 1 <= logged <= 3, logged
