"""VAGEN main's remote-env protocol as its own client speaks it, for the compat tests.

Written here (no code copied) from what VAGEN main's `GymImageEnvClient` puts on the wire
and how it reads the replies: github.com/mll-lab-nu/VAGEN, branch main, commit
2936322a6f6c02fbd29ca28e4b6ec37eefefc081, files vagen/envs_remote/gym_image_env_client.py
and vagen/envs_remote/multipart_codec.py. (PyPI's `vagen` is an unrelated Verilog-A
package, so the client can't be installed from there.) What it does:

- the env_config minus the client's own keys (base_urls, url_file, timeout, retries,
  backoff, max_delay, backoff_jitter_min, backoff_jitter_range, token, log_retries,
  failover_after_failures) is sent on the first reset, as POST {base}/connect with
  {"env_config": ..., "seed": seed}; later calls are POST {base}/call with
  {"session_id", "method", "params"};
- request bodies: multipart/form-data, boundary "gym_env_<hex>" quoted in the header, one
  part named "data" (no filename) of type "application/json; charset=utf-8";
- replies: split on the boundary, the application/json part is the data, every image/*
  part an image (opened as RGBA); obs = {"obs_str": data["obs"], "multi_modal_input":
  {"<image>": images}}; step returns (obs, float(reward), bool(done), info);
- the token, if any, goes in X-API-Key.
"""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import httpx
from PIL import Image

CLIENT_KEYS = {
    "base_urls", "url_file", "timeout", "retries", "backoff", "max_delay",
    "backoff_jitter_min", "backoff_jitter_range", "token", "log_retries",
    "failover_after_failures",
}  # fmt: skip


def encode(data: dict[str, Any]) -> tuple[str, bytes]:
    """(boundary, body) of a multipart/form-data request holding `data` as its JSON part."""
    boundary = f"gym_env_{uuid.uuid4().hex}"
    body = (
        (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="data"\r\n'
            "Content-Type: application/json; charset=utf-8\r\n\r\n"
        ).encode()
        + json.dumps(data, ensure_ascii=False).encode()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return boundary, body


def decode(content_type: str, body: bytes) -> tuple[dict[str, Any], list[Image.Image]]:
    """(the JSON part, the images) of a multipart reply, read the way VAGEN main reads it."""
    boundary = next(
        p.split("=", 1)[1].strip().strip('"')
        for p in (s.strip() for s in content_type.split(";"))
        if p.lower().startswith("boundary=")
    )
    data: dict[str, Any] = {}
    images: list[Image.Image] = []
    for chunk in body.split(f"--{boundary}".encode()):
        chunk = chunk.strip()
        if chunk.endswith(b"--"):
            chunk = chunk[:-2].strip()
        head, _, payload = chunk.partition(b"\r\n\r\n")
        if not payload:
            continue
        payload = payload.rstrip(b"\r\n")
        kind = ""
        for line in head.decode("utf-8", "ignore").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-type":
                kind = value.strip().lower()
        if "application/json" in kind:
            data = json.loads(payload)
        elif kind.startswith("image/"):
            images.append(Image.open(io.BytesIO(payload)).convert("RGBA"))
    return data, images


class RemoteEnv:
    """One remote env = one session (connect on the first reset), like VAGEN main's client."""

    def __init__(self, env_config: dict[str, Any]) -> None:
        urls = env_config["base_urls"]
        self.base = (urls if isinstance(urls, str) else urls[0]).strip()
        self.token = env_config.get("token")
        self.timeout = float(env_config.get("timeout", 120.0))
        self.remote_config = {k: v for k, v in env_config.items() if k not in CLIENT_KEYS}
        self.session_id: str | None = None
        self.http = httpx.Client(timeout=self.timeout)

    def _post(self, path: str, data: dict[str, Any]) -> tuple[dict[str, Any], list[Image.Image]]:
        boundary, body = encode(data)
        headers = {"Content-Type": f'multipart/form-data; boundary="{boundary}"'}
        if self.token:
            headers["X-API-Key"] = self.token
        response = self.http.post(self.base + path, content=body, headers=headers)
        response.raise_for_status()
        return decode(response.headers.get("content-type", ""), response.content)

    def _call(self, method: str, params: dict[str, Any] | None = None):
        body = {"session_id": self.session_id, "method": method, "params": params or {}}
        return self._post("/call", body)

    @staticmethod
    def _obs(data: dict[str, Any], images: list[Image.Image]) -> dict[str, Any]:
        obs: dict[str, Any] = {"obs_str": data.get("obs", "")}
        if images:
            obs["multi_modal_input"] = {"<image>": images}
        return obs

    def reset(self, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.session_id is None:
            data, images = self._post("/connect", {"env_config": self.remote_config, "seed": seed})
            self.session_id = data.get("session_id")
            if not self.session_id:
                raise RuntimeError("Server did not return session_id")
        else:
            data, images = self._call("reset", {"seed": seed})
        return self._obs(data, images), data.get("info", {})

    def system_prompt(self) -> dict[str, Any]:
        return self._obs(*self._call("system_prompt"))

    def step(self, action_str: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        data, images = self._call("step", {"action_str": action_str})
        reward, done = float(data.get("reward", 0.0)), bool(data.get("done", False))
        return self._obs(data, images), reward, done, data.get("info", {})

    def close(self) -> None:
        if self.session_id is not None:
            try:
                self._call("close")
            finally:
                self.session_id = None
        self.http.close()
