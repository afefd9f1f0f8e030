"""Hostile inputs of issue 42 over every transport: what the server answers, and what
they cost others (a probe session's step latency, the slots held afterwards).

    python bench/hostile_inputs.py            # starts its own servers (this checkout)

Each line: the probe, the answer (HTTP status / gRPC code / WebSocket message), and for
the probes that could hold a slot, the sessions the server counts afterwards. Run it
from another checkout (`cd ../other && python bench/hostile_inputs.py`) to serve that
checkout's code: the launcher serves the repository the script sits in.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from typing import Any

import grpc
import httpx
from websockets.sync.client import connect as ws_connect

from env_server.testing.launcher import ROOT, launch_server
from visenv.v1 import visenv_pb2 as pb
from visenv.v1 import visenv_pb2_grpc as pb_grpc


def deep(n: int) -> str:
    """A JSON object nested n deep."""
    return '{"a":' * n + "1" + "}" * n


def show(name: str, answer: Any, **more: Any) -> None:
    extra = "".join(f"  {k}={v}" for k, v in more.items())
    print(f"{name:58s} {str(answer)[:150]}{extra}", flush=True)


def rest_answer(r: httpx.Response) -> str:
    try:
        error = r.json().get("error") if r.headers.get("content-type", "").startswith(
            "application/json") else None  # fmt: skip
    except ValueError:
        error = None
    if isinstance(error, dict):
        return f"{r.status_code} {error.get('code')} field={error.get('field')}"
    return f"{r.status_code}"


def sessions(http: httpx.Client) -> int:
    return http.get("/health").json()["sessions"]


def grpc_code(call, request) -> str:
    try:
        call(request, timeout=30)
        return "OK"
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()[:80]}"


def grpc_item_code(reply: pb.BatchResponse) -> str:
    return ",".join(r.error.code or "ok" for r in reply.results)


def main() -> None:
    print(f"serving {ROOT}", flush=True)
    server = launch_server(workers=2, envs="sokoban", max_sessions=64)
    http = httpx.Client(base_url=server.url, timeout=60)
    channel = grpc.insecure_channel(server.grpc)
    stub = pb_grpc.VisenvStub(channel)
    json_headers = {"content-type": "application/json"}

    def post(path: str, text: str) -> httpx.Response:
        return http.post(path, content=text.encode("utf-8", "surrogatepass"), headers=json_headers)

    def probe() -> str:
        return http.post("/v1/sessions", json={"env": "sokoban", "format": "no_think"}).json()[
            "session_id"
        ]

    try:
        print("-- 1. nested config: answer, and slots held after (0 expected)")
        for n in (600, 100_000):
            r = post("/v1/sessions", f'{{"env":"sokoban","config":{deep(n)}}}')
            show(f"REST create, config {n} deep", rest_answer(r), sessions=sessions(http))
        good = '{"env":"sokoban"}'
        r = post(
            "/v1/batch/create",
            f'{{"items":[{good},{{"env":"sokoban","config":{deep(600)}}},{good}]}}',
        )
        items = r.json().get("results") if r.status_code == 200 else None
        codes = [i.get("error", {}).get("code", "ok") for i in items] if items else None
        show("REST batch/create [good, 600 deep, good]", f"{rest_answer(r)} {codes}",
             sessions=sessions(http))  # fmt: skip
        if items:
            http.post(
                "/v1/batch/close",
                json={"session_ids": [i["session_id"] for i in items if "session_id" in i]},
            )
        for field in ("config_json", "reasoning_json"):
            for n in (600, 100_000):
                request = pb.CreateRequest(
                    items=[pb.SessionOptions(env="sokoban", **{field: deep(n)})]
                )
                try:
                    answer = grpc_item_code(stub.Create(request, timeout=30))
                except grpc.RpcError as exc:
                    answer = f"{exc.code().name}: {exc.details()[:80]}"
                show(f"gRPC Create, {field} {n} deep", answer, sessions=sessions(http))

        print("-- 3. lone surrogates: answer, then GET of the same session")
        for name, body in (
            ("response '\\ud800'", '{"step_index":0,"response":"<answer>\\ud800</answer>"}'),
            ("action name '\\ud800'", '{"step_index":0,"actions":[{"name":"\\ud800"}]}'),
        ):
            sid = probe()
            r = post(f"/v1/sessions/{sid}/step", body)
            after = http.get(f"/v1/sessions/{sid}")
            show(f"REST step, {name}", rest_answer(r), get_after=rest_answer(after))
            http.delete(f"/v1/sessions/{sid}")
        r = post("/v1/sessions", '{"env":"sokoban","config":{"x":"\\ud800"}}')
        show("REST create, config string '\\ud800'", rest_answer(r), sessions=sessions(http))

        print("-- 4. the other transports: gRPC bytes, WebSocket, VAGEN data part")
        raw = channel.unary_unary("/visenv.v1.Visenv/Get", request_serializer=None,
                                  response_deserializer=None)  # fmt: skip
        show("gRPC Get, session_ids with invalid UTF-8", grpc_code(raw, b"\x0a\x02\xff\xfe"))
        ws_url = server.url.replace("http", "ws") + "/compat/openenv/sokoban/ws"
        for name, message in (
            ("reset, config 600 deep", f'{{"type":"reset","data":{{"config":{deep(600)}}}}}'),
            (
                "reset, config 100000 deep",
                f'{{"type":"reset","data":{{"config":{deep(100_000)}}}}}',
            ),
            ("step, action '\\ud800'", '{"type":"step","data":{"actions":["\\ud800"]}}'),
            ("reset, seed true", '{"type":"reset","data":{"seed":true}}'),
            ('reset, seed "5"', '{"type":"reset","data":{"seed":"5"}}'),
            ("step, NaN arg", '{"type":"step","data":{"actions":[{"name":"Left","args":[NaN]}]}}'),
        ):
            with ws_connect(ws_url, max_size=None) as ws:
                ws.send(message)
                try:
                    reply = json.loads(ws.recv(timeout=30))
                    answer = (
                        reply["type"]
                        + " "
                        + json.dumps(reply["data"].get("visenv_code") or reply["data"].get("code"))
                        + " field="
                        + str(reply["data"].get("field"))
                    )
                except Exception as exc:  # noqa: BLE001 - a closed connection is the answer
                    answer = f"no reply: {type(exc).__name__} {getattr(exc, 'rcvd', '')}"
            show(f"WS {name}", answer, sessions=sessions(http))
        vagen = "/compat/vagen/sokoban/connect"
        for n in (600, 100_000):
            files = {
                "data": (None, f'{{"env_config":{{}},"seed":0,"x":{deep(n)}}}', "application/json")
            }
            show(f"VAGEN connect, data part {n} deep", rest_answer(http.post(vagen, files=files)),
                 sessions=sessions(http))  # fmt: skip

        print("-- 8. types")
        for value in ('"0"', "0.0", "true"):
            sid = probe()
            r = post(
                f"/v1/sessions/{sid}/step",
                f'{{"step_index":{value},"actions":[{{"name":"Left"}}]}}',
            )
            show(f"REST step, step_index {value}", rest_answer(r))
            http.delete(f"/v1/sessions/{sid}")
        sid = probe()
        r = http.post(f"/v1/sessions/{sid}/step",
                      json={"step_index": 0, "actions": [{"name": "Left", "args": [0] * 100_000}]})  # fmt: skip
        show("REST step, Left with 100,000 args", rest_answer(r))
        http.delete(f"/v1/sessions/{sid}")

        print("-- 9. smaller ones")
        r = http.request("PUT", "/v1/sessions")
        show("REST PUT /v1/sessions", rest_answer(r), allow=r.headers.get("allow"))

        print("-- 2. an 80,000-part multipart body vs a probe session's steps")
        sid = probe()
        lat: list[float] = []
        stop = threading.Event()

        def stepper() -> None:
            with httpx.Client(base_url=server.url, timeout=120) as own:
                n = own.get(f"/v1/sessions/{sid}").json()["step_index"]
                while not stop.is_set():
                    t = time.perf_counter()
                    own.post(
                        f"/v1/sessions/{sid}/step",
                        json={"step_index": n, "actions": [{"name": "Left"}]},
                    )
                    lat.append(time.perf_counter() - t)
                    n += 1
                    time.sleep(0.05)

        thread = threading.Thread(target=stepper)
        thread.start()
        time.sleep(1.0)
        idle = len(lat)
        boundary = "b0undary"
        parts = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="p{i}"\r\n\r\nx\r\n'
                        for i in range(80_000))  # fmt: skip
        body = (parts + f'--{boundary}\r\nContent-Disposition: form-data; name="data"\r\n\r\n'
                '{"env_config":{},"seed":0}\r\n' + f"--{boundary}--\r\n").encode()  # fmt: skip
        t = time.perf_counter()
        r = http.post(
            vagen,
            content=body,
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
        took = time.perf_counter() - t
        time.sleep(1.0)
        stop.set()
        thread.join()
        during = lat[idle:]
        show(f"VAGEN connect, 80,000 parts ({len(body) / 1e6:.1f} MB)", rest_answer(r),
             took_s=round(took, 2), probe_idle_p50_ms=round(statistics.median(lat[:idle]) * 1e3, 1),
             probe_max_during_ms=round(max(during) * 1e3, 1))  # fmt: skip
    finally:
        channel.close()
        http.close()
        server.stop()

    print("-- 9. the token (a server with --token)")
    server = launch_server(workers=1, envs="sokoban", token="sekret")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for path in ("/", "/play", "/v1/envs"):
                show(f"REST GET {path} without a token", rest_answer(http.get(path)))
            r = http.get("/v1/limits", headers={"authorization": "bearer sekret"})
            show("REST lowercase 'bearer'", rest_answer(r))
        with grpc.insecure_channel(server.grpc) as channel:
            stub = pb_grpc.VisenvStub(channel)
            try:
                stub.ListEnvs(
                    pb.ListEnvsRequest(), metadata=[("authorization", "bearer sekret")], timeout=30
                )
                answer = "OK"
            except grpc.RpcError as exc:
                answer = exc.code().name
            show("gRPC lowercase 'bearer'", answer)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
