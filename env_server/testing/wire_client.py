"""A third, independent client of the wire protocol (REST over httpx, gRPC over the
generated stub), answering every call as REST's JSON batch items.

It is deliberately independent of `visenv.wire` (and of the SDK in clients/): the server
contract checks the server's mapping between the wire and the service with this hand-written
mapping, so that a bug in `visenv.wire`'s mapping is not hidden by the same code on both
sides of the check. (Only its gRPC channel is opened by visenv.wire's `open_channel`, the one
place that opens channels: that is no part of the mapping.)
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np

SERVER_TIMEOUT = 600.0  # seconds a call may take (a ManiSkill create warms its shaders)


class WireClient:
    """The calls of the wire protocol, answered as REST's JSON batch items:
    `{"ok": true, "reply": {...}}` or `{"ok": false, "error": {"code", "message", "field"}}`,
    image data as bytes on both transports."""

    def create(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    def reset(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    def step(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    def get(self, session_ids: list[str]) -> list[dict[str, Any]]: ...
    def close(self, session_ids: list[str]) -> list[dict[str, Any]]: ...
    def frame(self, session_id: str) -> bytes | None: ...  # None: not on this transport
    def shut(self) -> None: ...

    @staticmethod
    def connect(transport: str, address: str, token: str | None = None) -> WireClient:
        if transport.endswith("rest"):
            return RestWire(address, token)
        return GrpcWire(address, token)


class RestWire(WireClient):
    def __init__(self, url: str, token: str | None = None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=SERVER_TIMEOUT)

    def _batch(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        answer = self.http.post(path, json=body)
        assert answer.status_code == 200, f"POST {path}: HTTP {answer.status_code} {answer.text}"
        results = answer.json()["results"]
        for item in results:
            for image in item.get("reply", {}).get("observation", {}).get("images", []):
                image["data"] = base64.b64decode(image["data"])
        return results

    def create(self, items):
        return self._batch("/v1/batch/create", {"items": items})

    def reset(self, items):
        return self._batch("/v1/batch/reset", {"items": items})

    def step(self, items):
        return self._batch("/v1/batch/step", {"items": items})

    def get(self, session_ids):
        out = []
        for sid in session_ids:  # REST has no batch get
            answer = self.http.get(f"/v1/sessions/{sid}")
            body = answer.json()
            if answer.status_code == 200:
                for image in body["observation"]["images"]:
                    image["data"] = base64.b64decode(image["data"])
                out.append({"ok": True, "reply": body})
            else:
                out.append({"ok": False, **body})
        return out

    def close(self, session_ids):
        return self._batch("/v1/batch/close", {"session_ids": session_ids})

    def frame(self, session_id):
        answer = self.http.get(f"/v1/sessions/{session_id}/frame.png")
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "image/png"
        return answer.content

    def shut(self):
        self.http.close()


class GrpcWire(WireClient):
    def __init__(self, address: str, token: str | None = None) -> None:
        from visenv.v1 import visenv_pb2 as pb
        from visenv.v1 import visenv_pb2_grpc as pb_grpc
        from visenv.wire.channel import MAX_MESSAGE_BYTES, open_channel

        self.pb = pb
        self.channel = open_channel(
            address, sync=True, options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        )
        self.stub = pb_grpc.VisenvStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def _call(self, method: str, request: Any) -> Any:
        return getattr(self.stub, method)(request, timeout=SERVER_TIMEOUT, metadata=self.metadata)

    @staticmethod
    def _error(err: Any) -> dict[str, Any]:
        field_ = err.field if err.HasField("field") else None
        return {"ok": False, "error": {"code": err.code, "message": err.message, "field": field_}}

    def _items(self, response: Any) -> list[dict[str, Any]]:
        out = []
        for item in response.results:
            if not item.HasField("reply"):
                out.append(self._error(item.error))
                continue
            r = item.reply
            parts = r.reward_parts
            reply = {
                "session_id": r.session_id, "env": r.env, "step_index": r.step_index,
                "episode": r.episode, "turn": r.turn,
                "observation": {
                    "text": r.observation.text,
                    "images": [{"encoding": im.encoding, "data": im.data, "shape": list(im.shape)}
                               for im in r.observation.images],
                    "ground_truth": json.loads(r.observation.ground_truth_json or "{}"),
                    "info": json.loads(r.observation.info_json or "{}"),
                },
                "reward": r.reward,
                "reward_parts": {k: getattr(parts, k) for k in
                                 ("env", "format", "observation", "prediction", "penalty")},
                "terminated": r.terminated, "truncated": r.truncated, "success": r.success,
                "info": json.loads(r.info_json or "{}"),
            }  # fmt: skip
            if r.system_prompt:
                reply["system_prompt"] = r.system_prompt
            out.append({"ok": True, "reply": reply})
        return out

    def create(self, items):
        pb = self.pb
        options = [
            pb.SessionOptions(
                env=o["env"], seed=o.get("seed", 0), config_json=json.dumps(o.get("config", {})),
                reasoning_json=json.dumps(o.get("reasoning", {})),
                **{k: o[k] for k in ("format", "representation", "image_encoding") if k in o},
            )
            for o in items
        ]  # fmt: skip
        return self._items(self._call("Create", pb.CreateRequest(items=options)))

    def reset(self, items):
        pb = self.pb
        request = pb.ResetRequest(items=[
            pb.ResetItem(session_id=i["session_id"], **({"seed": i["seed"]} if "seed" in i else {}))
            for i in items
        ])  # fmt: skip
        return self._items(self._call("Reset", request))

    def step(self, items):
        pb = self.pb
        out = []
        for i in items:
            item = pb.StepItem(session_id=i["session_id"], step_index=i["step_index"])
            if i.get("actions") is not None:
                item.actions.CopyFrom(pb.ActionList(actions=[
                    pb.Action(name=a["name"], args=a.get("args", []),
                              **({"payload": a["payload"]} if a.get("payload") is not None else {}))
                    for a in i["actions"]
                ]))  # fmt: skip
            else:
                item.response = i["response"]
            out.append(item)
        return self._items(self._call("Step", pb.StepRequest(items=out)))

    def get(self, session_ids):
        return self._items(self._call("Get", self.pb.GetRequest(session_ids=session_ids)))

    def close(self, session_ids):
        response = self._call("Close", self.pb.CloseRequest(session_ids=session_ids))
        return [{"ok": True} if r.ok else self._error(r.error) for r in response.results]

    def frame(self, session_id):
        return None  # gRPC carries images in replies only

    def shut(self):
        self.channel.close()


def decode_image(image: dict[str, Any]) -> np.ndarray:
    """A wire image (encoding, data bytes, shape) as an (H, W, 3) uint8 array."""
    import io

    from PIL import Image

    shape = tuple(image["shape"])
    if image["encoding"] == "raw":
        array = np.frombuffer(image["data"], np.uint8)
        assert array.size == math.prod(shape), f"raw image of {array.size} bytes, shape {shape}"
        return array.reshape(shape)
    with Image.open(io.BytesIO(image["data"])) as im:
        assert im.format.lower() == {"png": "png", "jpeg": "jpeg"}[image["encoding"]]
        array = np.asarray(im.convert("RGB"))
    assert array.shape == shape, f"{image['encoding']} image decodes to {array.shape}, not {shape}"
    return array
