"""Which hand-written files one Sokoban step passes through, over REST and over gRPC.

Runs a real service (one worker process, forked) with the REST app and the gRPC server in
this process, creates a session on each transport, and profiles exactly one step request
(a model's response; then, as `rest+actions` / `grpc+actions`, one of explicit actions):
every Python function called while the step is in flight, in this process and in the
worker (the profiler is inherited through the fork and switched on and off by a flag in
shared memory), is mapped to its file. Files of this repository count as hand-written,
except the code generated from the .proto (visenv/v1/*_pb2*.py).

    python bench/step_path.py            # a table per transport
    python bench/step_path.py --json     # the same as JSON

The `layers` column groups the files by the folder they sit in, which is how
docs/step_path.md draws the path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESPONSE = (
    "<think><observation>The box is below the player.</observation>"
    "<reasoning>Push it down.</reasoning>"
    "<prediction>The box is below the player.</prediction></think><answer>Down</answer>"
)
# the number of the traced window, 0 between windows; created before the worker forks,
# so that the worker reads the same shared memory
ON = multiprocessing.RawValue("i", 0)
OUT = Path(tempfile.mkdtemp(prefix="visenv-step-path-"))
_seen: set[tuple[int, str]] = set()  # (window, file) already written, in each process


def _profile(frame, event, arg):  # noqa: ANN001  (sys.setprofile's signature)
    window = ON.value
    if event != "call" or not window:
        return
    key = (window, frame.f_code.co_filename)
    if key in _seen:
        return
    _seen.add(key)
    name = key[1]
    with open(OUT / f"{os.getpid()}.txt", "a") as fh:
        fh.write(name + "\n")


def _collect() -> list[str]:
    files: set[str] = set()
    for part in OUT.glob("*.txt"):
        files.update(part.read_text().split("\n"))
        part.unlink()
    out = []
    for name in files:
        path = Path(name)
        if not path.is_absolute() or ROOT not in path.parents:
            continue
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith((".venv", "bench/")) or "_pb2" in rel:
            continue
        out.append(rel)
    return sorted(out)


_windows = iter(range(1, 1000))


async def _traced(call) -> list[str]:  # noqa: ANN001
    ON.value = next(_windows)
    try:
        await call()
    finally:
        await asyncio.sleep(0.2)  # the worker has answered; let any trailing callbacks run
        ON.value = 0
    return _collect()


async def main() -> dict[str, list[str]]:
    import grpc
    import httpx

    from env_server.api.grpc_server import build_grpc_server
    from env_server.api.rest import build_app
    from env_server.service.service import EnvService
    from env_server.service.settings import Settings
    from visenv.v1 import visenv_pb2 as pb
    from visenv.v1 import visenv_pb2_grpc as pb_grpc

    sys.setprofile(_profile)
    threading.setprofile(_profile)
    settings = Settings(workers=1, envs="sokoban", start_method="fork")
    service = EnvService(settings)
    await service.start()
    paths: dict[str, list[str]] = {}
    try:
        app = build_app(service, None, settings.max_request_bytes)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://step-path") as http:
            body = {"env": "sokoban", "seed": 3, "format": "grounding_worldmodeling"}
            created = await http.post("/v1/sessions", json=body)
            sid = created.json()["session_id"]

            async def rest_step() -> None:
                reply = await http.post(
                    f"/v1/sessions/{sid}/step", json={"step_index": 0, "response": RESPONSE}
                )
                assert reply.status_code == 200, reply.text

            paths["rest"] = await _traced(rest_step)

            async def rest_actions() -> None:
                body = {"step_index": 1, "actions": [{"name": "Left"}]}
                reply = await http.post(f"/v1/sessions/{sid}/step", json=body)
                assert reply.status_code == 200, reply.text

            paths["rest+actions"] = await _traced(rest_actions)

        server = build_grpc_server(service, "127.0.0.1:0", None)
        await server.start()
        port = getattr(server, "port", None)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.VisenvStub(channel)
                options = pb.SessionOptions(env="sokoban", seed=3, format="grounding_worldmodeling")
                created = await stub.Create(pb.CreateRequest(items=[options]))
                sid = created.results[0].reply.session_id

                async def grpc_step() -> None:
                    item = pb.StepItem(session_id=sid, step_index=0, response=RESPONSE)
                    reply = await stub.Step(pb.StepRequest(items=[item]))
                    assert reply.results[0].HasField("reply"), reply

                paths["grpc"] = await _traced(grpc_step)

                async def grpc_actions() -> None:
                    item = pb.StepItem(session_id=sid, step_index=1)
                    item.actions.actions.add(name="Left")
                    reply = await stub.Step(pb.StepRequest(items=[item]))
                    assert reply.results[0].HasField("reply"), reply

                paths["grpc+actions"] = await _traced(grpc_actions)
        finally:
            await server.stop(grace=1)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        await service.stop()
    return paths


def layer(rel: str) -> str:
    parts = rel.split("/")
    return "/".join(parts[:2]) if parts[0] == "env_server" and len(parts) > 2 else parts[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    result = asyncio.run(main())
    if args.json:
        print(json.dumps({k: {"files": v, "count": len(v)} for k, v in result.items()}, indent=1))
    else:
        for transport, files in result.items():
            print(f"== one Sokoban step over {transport}: {len(files)} hand-written files")
            for rel in files:
                print(f"   {layer(rel):24s} {rel}")
