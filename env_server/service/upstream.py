"""One upstream visenv server as the gateway sees it: the visenv.v1 gRPC calls, answered
in the service's own terms (`SessionReply`, `EnvSpec`, `ServiceError`).

    upstream = Upstream("10.0.0.7:50051", token=None, timeout=60.0)
    await upstream.create([wire.SessionOptions("sokoban", seed=1)])  # [SessionReply | ServiceError]

An item's error is its `ServiceError`; a whole call that the upstream answered with an
error raises that `ServiceError`, and one that got no answer at all raises `UpstreamDown`
(the upstream can't be reached: its sessions are gone with it). A deadline passed is
UNAVAILABLE: the upstream did not answer in time.
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from visenv import wire
from visenv.v1 import visenv_pb2 as pb

from .models import EnvSpec, Result, ServiceError, SessionReply


class UpstreamDown(Exception):
    """No answer came from the upstream: it can't be reached."""


def service_error(err: wire.Error) -> ServiceError:
    """An upstream's error as our own (its deadline passing is the upstream being unavailable)."""
    code = "UNAVAILABLE" if err.code == "DEADLINE_EXCEEDED" else err.code
    error = ServiceError(code, err.message, err.field)
    error.error_id = err.error_id
    return error


def _results(answers: list) -> list:
    return [service_error(a) if isinstance(a, wire.Error) else a for a in answers]


class Upstream:
    """The visenv.v1 service of one upstream server over one grpc.aio channel."""

    def __init__(self, address: str, token: str | None, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._rpc = wire.Channel(address, token, timeout)

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await self._rpc.call(method, request)
        except grpc.aio.AioRpcError as exc:
            code = wire.rpc_error_code(exc)
            if code is not None:  # an answer of the upstream's visenv servicer
                raise service_error(wire.Error(code, exc.details() or "")) from exc
            status = exc.code()
            if status == grpc.StatusCode.UNAVAILABLE:
                raise UpstreamDown(f"{self.address}: {exc.details()}") from exc
            if status == grpc.StatusCode.DEADLINE_EXCEEDED:
                message = f"upstream {self.address}: no reply within {self.timeout}s"
            else:
                message = f"upstream {self.address}: {exc.details()}"
            raise service_error(wire.Error(wire.code_of_grpc(status), message)) from exc

    async def status(self) -> dict[str, Any]:
        """The upstream's /health JSON (its node, boot, sessions, ...)."""
        return json.loads((await self._call("Status", pb.StatusRequest())).status_json)

    async def list_envs(self) -> list[EnvSpec]:
        resp = await self._call("ListEnvs", pb.ListEnvsRequest())
        return [EnvSpec.from_proto(e) for e in resp.envs]

    async def create(self, items: list[wire.SessionOptions]) -> list[Result]:
        req = pb.CreateRequest(items=[o.to_proto() for o in items])
        return _results(wire.batch_from_proto(await self._call("Create", req)))

    async def reset(self, items: list[tuple[str, int | None, str | None]]) -> list[Result]:
        """(session_id, seed, image_encoding) items."""
        req = pb.ResetRequest(
            items=[pb.ResetItem(session_id=s, seed=seed, image_encoding=e) for s, seed, e in items]
        )
        return _results(wire.batch_from_proto(await self._call("Reset", req)))

    async def step(self, items: list[wire.StepItem]) -> list[Result]:
        return _results(wire.batch_from_proto(await self._call("Step", wire.step_request(items))))

    async def get(self, session_ids: list[str]) -> list[Result]:
        resp = await self._call("Get", pb.GetRequest(session_ids=session_ids))
        return _results(wire.batch_from_proto(resp))

    async def close(self, session_ids: list[str]) -> list[ServiceError | None]:
        resp = await self._call("Close", pb.CloseRequest(session_ids=session_ids))
        return _results(wire.close_from_proto(resp))

    async def fork(self, items: list[tuple[str, int]]) -> list[list[SessionReply] | ServiceError]:
        """(session_id, n) items: each answers its n forks' replies, or one error."""
        req = pb.ForkRequest(items=[pb.ForkItem(session_id=sid, n=n) for sid, n in items])
        return _results(wire.fork_from_proto(await self._call("Fork", req)))

    async def frame(self, session_ids: list[str]) -> list[bytes | ServiceError]:
        resp = await self._call("Frame", pb.FrameRequest(session_ids=session_ids))
        return _results(wire.frames_from_proto(resp))

    async def aclose(self) -> None:
        await self._rpc.aclose()
