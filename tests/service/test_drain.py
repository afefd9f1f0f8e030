"""A drained server (SIGUSR1 to `visenv serve`, as `visenv ray scale` sends it) takes no new
sessions and serves its open ones to the end; /health says so and counts them."""

from __future__ import annotations

import os
import signal
import time


def test_a_drained_server_refuses_creates_and_serves_its_sessions(start_visenv_server):
    server = start_visenv_server(workers=1, envs="sokoban")
    with server.client() as http:
        sid = http.post("/v1/sessions", json={"env": "sokoban", "seed": 3}).json()["session_id"]
        assert http.get("/health").json()["draining"] is False
        os.kill(server.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not http.get("/health").json()["draining"]:
            assert time.monotonic() < deadline, "SIGUSR1 did not drain the server"
            time.sleep(0.05)

        refused = http.post("/v1/sessions", json={"env": "sokoban", "seed": 4})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "UNAVAILABLE"
        assert "draining" in refused.json()["error"]["message"]

        stepped = http.post(
            f"/v1/sessions/{sid}/step", json={"step_index": 0, "actions": [{"name": "Up"}]}
        )
        assert stepped.status_code == 200, stepped.text
        health = http.get("/health").json()
        assert health["sessions"] == 1 and health["draining"] is True
        assert http.delete(f"/v1/sessions/{sid}").status_code in (200, 204)
        assert http.get("/health").json()["sessions"] == 0
    assert server.alive  # draining stops nothing by itself: whoever drained it stops it
