"""visenv sessions as a verl interaction (verl's multi-turn rollout, `BaseInteraction`).

verl's rollout calls, per sample (verl/interactions/base.py):

    instance_id = await interaction.start_interaction(instance_id, **interaction_kwargs)
    done, text, score, extra = await interaction.generate_response(instance_id, messages)
    await interaction.calculate_score(instance_id)      # the episode's return so far
    await interaction.finalize_interaction(instance_id) # closes the session

Here each instance is one visenv session: `start_interaction` creates it (the sample's
`interaction_kwargs` give env, seed, config, format, ...), `generate_response` steps it
with the last assistant message and answers the next observation's text (with its
`<image>` placeholders; the images are in `extra["images"]` as PIL images), the turn's
reward, and `done` when the episode ends. `initial_prompt(instance_id)` gives the system
prompt and first observation, to build the sample's prompt.

verl's interaction config (e.g. `interaction_config.yaml`):

    interaction:
      - name: visenv
        class_name: clients.verl_interaction.VisenvInteraction
        config: {servers: ["127.0.0.1:50051"], transport: grpc, env: sokoban,
                 format: grounding_worldmodeling}

verl is not a dependency of visenv: the class subclasses verl's BaseInteraction when
verl is installed and has the same interface without it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from .client import AsyncEnvClient
from .types import SessionOptions, SessionReply

try:  # pragma: no cover - exercised only where verl is installed
    from verl.interactions.base import BaseInteraction
except ImportError:  # the same interface, without verl

    class BaseInteraction:  # type: ignore[no-redef]
        def __init__(self, config: dict[str, Any]) -> None:
            self.config = config
            self.name: str = config.get("name", "interaction_agent")


SESSION_KEYS = ("env", "seed", "config", "format", "representation", "reasoning")


@dataclass
class _Episode:
    session_id: str
    last: SessionReply
    total: float = 0.0


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """The content of the last assistant message (plain text or a list of text parts)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if p.get("type") == "text")
            return str(content)
    raise ValueError("no assistant message to step the environment with")


class VisenvInteraction(BaseInteraction):
    """One visenv session per verl interaction instance (see the module docstring).

    config: servers ("host:port" or a list), transport ("grpc" | "http"), token, timeout,
    and session defaults (env, config, format, representation, reasoning) that each
    sample's interaction_kwargs may override.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.defaults = {k: config[k] for k in SESSION_KEYS if k in config}
        self._client: AsyncEnvClient | None = None
        self._episodes: dict[str, _Episode] = {}

    @property
    def client(self) -> AsyncEnvClient:
        if self._client is None:  # made on first use, inside verl's event loop
            self._client = AsyncEnvClient(
                self.config["servers"],
                transport=self.config.get("transport", "grpc"),
                token=self.config.get("token"),
                timeout=float(self.config.get("timeout", 60.0)),
            )
        return self._client

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        unknown = sorted(set(kwargs) - set(SESSION_KEYS) - {"name"})
        if unknown:
            raise ValueError(f"unknown interaction_kwargs {unknown}; known: {SESSION_KEYS}")
        chosen = {**self.defaults, **{k: v for k, v in kwargs.items() if k != "name"}}
        if "env" not in chosen:
            raise ValueError("say which environment: `env` in the config or interaction_kwargs")
        (reply,) = await self.client.create(SessionOptions(**chosen))
        self._episodes[instance_id] = _Episode(reply.session_id, reply)
        return instance_id

    def initial_prompt(self, instance_id: str) -> tuple[str, str]:
        """(system prompt, first observation text) of the instance's episode."""
        reply = self._episodes[instance_id].last
        return reply.system_prompt or "", reply.observation.text

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        episode = self._episodes[instance_id]
        (reply,) = await self.client.step(episode.session_id, last_assistant_text(messages))
        episode.last = reply
        episode.total += reply.reward
        extra = {
            "images": [image.to_pil() for image in reply.observation.images],
            "success": reply.success,
            "terminated": reply.terminated,
            "truncated": reply.truncated,
            "reward_parts": reply.reward_parts.to_dict(),
            "info": reply.info,
        }
        return reply.done, reply.observation.text, reply.reward, extra

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        """The episode's return so far (the sum of its turns' rewards)."""
        if instance_id is None:
            return sum(e.total for e in self._episodes.values())
        return self._episodes[instance_id].total

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        """Close the instance's session (every session when no id is given)."""
        ids = [instance_id] if instance_id is not None else list(self._episodes)
        episodes = [self._episodes.pop(i) for i in ids if i in self._episodes]
        if episodes:
            await self.client.close([e.session_id for e in episodes])
