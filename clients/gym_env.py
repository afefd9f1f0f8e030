"""A `gymnasium.Env` over one remote visenv session.

    env = RemoteEnv("127.0.0.1:50051", "sokoban", action_mode="discrete")
    # or, registered with gymnasium:
    env = gymnasium.make("visenv/Remote-v0", server="127.0.0.1:50051", env="sokoban")
    obs, info = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

Observation space: a Dict with
  - "image": Box(0, 255, (H, W, 3), uint8) — the observation image (with several
    images per observation: "image", "image_1", "image_2", ...), shapes taken from
    the session's first observation;
  - "text": Text — the observation text, with "<image>" placeholders.
Action space:
  - action_mode="text" (default): Text — the agent's whole response, parsed by the
    server per the session's format (format and world-model rewards included);
  - action_mode="discrete" (environments whose actions are bare names, e.g. sokoban,
    frozenlake): Discrete(n) over the vocabulary, one explicit action per step (no
    format or world-model reward).
`info` holds the server's step info plus "ground_truth", "reward_parts" and, after a
reset, "system_prompt". Connection failures and server errors raise the client's
typed exceptions (SessionLost, ...); they are never reported as a zero reward.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .sync_client import EnvClient
from .types import ActionSpec, SessionOptions, SessionReply

# printable ASCII plus the Latin, Greek, symbol and box-drawing ranges environments
# write text with (e.g. sokoban's "√")
CHARSET = string.printable + "".join(chr(c) for c in range(0xA0, 0x2700))


class RemoteEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        server: str,
        env: str,
        config: dict[str, Any] | None = None,
        *,
        format: str | None = None,
        representation: str | None = None,
        reasoning: dict[str, Any] | None = None,
        action_mode: str = "text",
        transport: str = "grpc",
        token: str | None = None,
        timeout: float = 60.0,
        max_text_length: int = 16384,
        render_mode: str | None = None,
        seed: int = 0,
    ) -> None:
        if action_mode not in ("text", "discrete"):
            raise ValueError("action_mode must be 'text' or 'discrete'")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None")
        self.render_mode = render_mode
        self.action_mode = action_mode
        self._client = EnvClient(server, transport=transport, token=token, timeout=timeout)
        try:
            specs = {e.name: e for e in self._client.list_envs()}
            if env not in specs:
                raise ValueError(f"unknown environment {env!r}; the server has {sorted(specs)}")
            action_space = specs[env].action_space or {}
            options = SessionOptions(
                env=env,
                config=config or {},
                seed=seed,
                format=format,
                representation=representation,
                reasoning=reasoning or {},
                image_encoding="raw",
            )
            (reply,) = self._client.create(options)
        except BaseException:
            self._client.close_client()
            raise
        self.session_id = reply.session_id
        self._reply = reply
        self._image_keys = ["image"] + [
            f"image_{i}" for i in range(1, len(reply.observation.images))
        ]
        self.observation_space = spaces.Dict(
            {
                **{
                    key: spaces.Box(0, 255, shape=tuple(im.shape), dtype=np.uint8)
                    for key, im in zip(self._image_keys, reply.observation.images, strict=True)
                },
                "text": spaces.Text(max_length=max_text_length, min_length=0, charset=CHARSET),
            }
        )
        if action_mode == "discrete":
            if action_space.get("kind") != "discrete":
                self.close()
                raise ValueError(
                    f"{env!r} has {action_space.get('kind')!r} actions; use action_mode='text'"
                )
            self._names: list[str] = list(action_space["names"])
            self.action_space = spaces.Discrete(len(self._names))
        else:
            self.action_space = spaces.Text(
                max_length=max_text_length, min_length=0, charset=CHARSET
            )

    def _obs(self, reply: SessionReply) -> dict[str, Any]:
        obs: dict[str, Any] = {
            key: np.array(im.to_array(), dtype=np.uint8)
            for key, im in zip(self._image_keys, reply.observation.images, strict=True)
        }
        obs["text"] = reply.observation.text
        return obs

    @staticmethod
    def _info(reply: SessionReply) -> dict[str, Any]:
        info = dict(reply.info)
        info["ground_truth"] = reply.observation.ground_truth
        info["reward_parts"] = reply.reward_parts.to_dict()
        if reply.system_prompt:
            info["system_prompt"] = reply.system_prompt
        return info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is None:  # continue the generator that the last seeded reset started
            seed = int(self.np_random.integers(0, 2**31 - 1))
        (self._reply,) = self._client.reset(self.session_id, seed)
        return self._obs(self._reply), self._info(self._reply)

    def step(self, action: Any):
        if self.action_mode == "discrete":
            (reply,) = self._client.step_actions(
                self.session_id, [[ActionSpec(self._names[int(action)])]]
            )
        else:
            (reply,) = self._client.step(self.session_id, str(action))
        self._reply = reply
        return (
            self._obs(reply),
            float(reply.reward),
            reply.terminated,
            reply.truncated,
            self._info(reply),
        )

    def render(self):
        if self.render_mode == "rgb_array":
            return np.array(self._reply.observation.images[0].to_array(), dtype=np.uint8)
        return None

    def close(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            self._client = None  # type: ignore[assignment]
            client.close_client()  # closes the session too


GYM_ID = "visenv/Remote-v0"
if GYM_ID not in gym.registry:
    gym.register(GYM_ID, entry_point="clients.gym_env:RemoteEnv", disable_env_checker=True)
