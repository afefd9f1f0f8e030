"""Single-session REST steps for the benchmarks: one HTTP request per session and step,
as a training stack that keeps one client per episode sends them (the SDK's main path is
the batch call; this is what the benchmarks compare it with).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

from clients import AsyncEnvClient, SessionReply
from clients.errors import error_from_code


class SingleSessionRest:
    """POST /v1/sessions/{id}/step for each session, all at once; step indexes tracked here
    (starting from the client's, for sessions the client created)."""

    def __init__(self, client: AsyncEnvClient, token: str | None = None) -> None:
        self._client = client
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=300)
        self._next: dict[str, int] = {}

    async def step(
        self, session_ids: Sequence[str], responses: Sequence[str]
    ) -> list[SessionReply]:
        return list(
            await asyncio.gather(
                *(self._one(sid, text) for sid, text in zip(session_ids, responses, strict=True))
            )
        )

    async def _one(self, sid: str, text: str) -> SessionReply:
        server = self._client.server_of(sid)
        base = server if server.startswith("http") else f"http://{server}"
        index = self._next.get(sid, self._client.next_step_index(sid))
        resp = await self._http.post(
            f"{base}/v1/sessions/{sid}/step", json={"step_index": index, "response": text}
        )
        data = resp.json()
        if resp.status_code != 200:
            err = data["error"]
            raise error_from_code(err["code"], err["message"], err.get("field"))
        reply = SessionReply.from_json(data, server=server)
        self._next[sid] = reply.step_index
        return reply

    def forget(self, session_id: str) -> None:
        """Start again from the client's index (after a reset through the client)."""
        self._next.pop(session_id, None)

    async def aclose(self) -> None:
        await self._http.aclose()
