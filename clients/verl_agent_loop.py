"""visenv sessions as verl's agent loop (verl >= 0.9: `AgentLoopBase`), registered as `visenv`.

verl's `AgentLoopWorker` runs one `VisenvAgentLoop.run` per dataset row; one row is one
visenv episode. The row's `extra_info` says which (docs/verl.md, `visenv verl-data`
writes such rows):

    env (required), seed, config, format, representation, reasoning, max_turns

The loop creates the session, renders its system prompt and first observation through
verl's continuous-token builder (the processor expands each `<image>` into the model's
image tokens; the images go to the server manager and into `multi_modal_data`), then per
turn: generates through `self.server_manager`, steps the session with the decoded text,
appends the next observation as a user turn, until the episode ends, `max_turns` or
`rollout.response_length`. `response_mask` is 1 on the generated tokens only;
`reward_score` is the sum of the server's rewards; `extra_fields` hold the per-turn
rewards (`turn_scores`) and each turn's generated span (`visenv_turn_spans`, [start, end)
in response tokens); `metrics.tool_calls` is the time spent in the environment,
`metrics.generate_sequences` the time generating.

A server that fails mid-episode (UNAVAILABLE, SESSION_LOST, DEADLINE_EXCEEDED) restarts
the episode from its seed (the SDK places the new session on a live server), at most
`max_restarts` times; after that the output is flagged (`extra_fields["visenv_failed"]`,
`["visenv_error"]`: the reason) with an all-zero response mask, for a filter to drop
(`drop_failed`). It never raises through verl's gather.

All loops of a worker process share one `AsyncEnvClient` per (servers, transport, token)
and event loop; their step, create and close calls made in the same event-loop tick go
to the servers as one batch each (the SDK sends each call as it comes).

verl's agent-loop config (`actor_rollout_ref.rollout.agent.agent_loop_config_path`):

    - name: visenv
      _target_: clients.verl_agent_loop.VisenvAgentLoop
      servers: ["envs:50051"]      # passed as is to AsyncEnvClient(servers, ...)
      token: null                  # or $VISENV_TOKEN
      max_turns: 10
      max_tokens_per_turn: 256

This module imports verl; nothing else in clients/ does.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    _agent_loop_registry,
    register,
)

from .client import AsyncEnvClient
from .errors import DeadlineExceeded, SessionLost, Unavailable, VisenvError
from .types import Observation, SessionOptions, SessionReply

SERVERS_ENV_VAR = "VISENV_SERVERS"  # comma-separated, where the config names no servers
ROW_KEYS = ("env", "seed", "config", "format", "representation", "reasoning", "max_turns")
# failures of the infrastructure, not of the row: the episode is played again elsewhere
RESTARTABLE = (Unavailable, SessionLost, DeadlineExceeded)


class VisenvLoopMetrics(AgentLoopMetrics):
    """verl's per-sample metrics (`tool_calls`: seconds in the environment) and ours."""

    env_restarts: int = 0
    env_failed: int = 0


class _Batched:
    """Calls of one kind made in the same event-loop tick, sent as one batch call.

    `call(items) -> results` (one per item, errors in place); `submit(item)` answers the
    item's result, or raises it when it is an exception."""

    def __init__(self, call: Callable[[list[Any]], Awaitable[list[Any]]]) -> None:
        self.call = call
        self.pending: list[tuple[Any, asyncio.Future]] = []
        self.calls = 0  # batch calls sent
        self.items = 0  # items sent in them
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((item, future))
        if len(self.pending) == 1:
            loop.call_soon(self._flush)
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        task = asyncio.ensure_future(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        self.calls += 1
        self.items += len(batch)
        try:
            results = await self.call([item for item, _ in batch])
        except Exception as exc:  # the whole call failed: every item with it
            results = [exc] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


class SharedClient:
    """One `AsyncEnvClient` and the batchers of its create, step and close calls."""

    def __init__(self, client: AsyncEnvClient) -> None:
        self.client = client
        self.create = _Batched(lambda opts: client.create(opts, return_exceptions=True))
        self.step = _Batched(
            lambda items: client.step(
                [sid for sid, _ in items], [text for _, text in items], return_exceptions=True
            )
        )
        self.close = _Batched(client.close)


_SHARED: dict[tuple, SharedClient] = {}


def shared_client(
    servers: str | Sequence[str],
    transport: str = "grpc",
    token: str | None = None,
    timeout: float = 60.0,
) -> SharedClient:
    """The worker process's client for these servers on the running event loop."""
    addresses = (servers,) if isinstance(servers, str) else tuple(str(s) for s in servers)
    key = (addresses, transport, token, timeout, id(asyncio.get_running_loop()))
    if key not in _SHARED:
        client = AsyncEnvClient(
            addresses[0] if len(addresses) == 1 else list(addresses),
            transport=transport,
            token=token,
            timeout=timeout,
        )
        _SHARED[key] = SharedClient(client)
    return _SHARED[key]


@dataclass
class EpisodeSpec:
    """One dataset row's episode (its `extra_info`)."""

    options: SessionOptions
    max_turns: int | None = None

    @classmethod
    def from_row(cls, extra_info: Any) -> EpisodeSpec:
        row = dict(extra_info or {})
        if not row.get("env"):
            raise ValueError(
                f"a visenv row needs extra_info['env'] (known keys: {ROW_KEYS}); got {sorted(row)}"
            )
        bad = {
            k: row[k]
            for k in ("seed", "max_turns")
            if row.get(k) is not None and not isinstance(row[k], int)
        }
        if bad:
            raise ValueError(f"extra_info {bad}: seed and max_turns must be integers")
        options = SessionOptions(
            env=str(row["env"]),
            seed=int(row.get("seed") or 0),
            config=_json_object(row, "config"),
            format=row.get("format") or None,
            representation=row.get("representation") or None,
            reasoning=_json_object(row, "reasoning"),
        )
        return cls(options, row.get("max_turns"))


def _json_object(row: dict[str, Any], key: str) -> dict[str, Any]:
    """A row's config or reasoning: a dict, or its JSON text (as parquet rows hold it)."""
    value = row.get(key) or {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"extra_info[{key!r}] is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"extra_info[{key!r}] must be a JSON object, got {value!r}")
    return dict(value)


def user_message(observation: Observation) -> dict[str, Any]:
    """The observation as a chat turn: its text with an image part at each `<image>`."""
    pieces = observation.text.split("<image>")
    if len(pieces) - 1 != len(observation.images):
        raise ValueError(
            f"observation has {len(pieces) - 1} <image> placeholders "
            f"but {len(observation.images)} images"
        )
    content: list[dict[str, Any]] = []
    for i, piece in enumerate(pieces):
        if i:
            content.append({"type": "image", "image": observation.images[i - 1].to_pil()})
        if piece:
            content.append({"type": "text", "text": piece})
    return {"role": "user", "content": content}


@dataclass
class _Episode:
    """What one play of the episode built (the output's pieces)."""

    prompt_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # prompt and response, as they run
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    images: list[Any] = field(default_factory=list)
    turn_scores: list[float] = field(default_factory=list)
    turn_spans: list[list[int]] = field(default_factory=list)
    observations: int = 1  # user turns: the first observation and those appended
    last: SessionReply | None = None


class VisenvAgentLoop(AgentLoopBase):
    """One visenv episode per sample (see the module docstring).

    servers, transport, token, timeout: the SDK client's (`AsyncEnvClient`); servers
        default to $VISENV_SERVERS (comma-separated).
    max_turns: turns per episode unless the row says (None: the environment's limit).
    max_tokens_per_turn: generated tokens per turn (None: what is left of
        `rollout.response_length`).
    max_restarts: plays of an episode again after a server failed, before it is flagged.
    """

    def __init__(
        self,
        *args: Any,
        servers: str | Sequence[str] | None = None,
        transport: str = "grpc",
        token: str | None = None,
        timeout: float = 60.0,
        max_turns: int | None = None,
        max_tokens_per_turn: int | None = None,
        max_restarts: int = 2,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("tools", None)  # verl passes its tool list to every loop; we have none
        super().__init__(*args, **kwargs)
        servers = servers or os.environ.get(SERVERS_ENV_VAR, "").split(",")
        if not any(servers):
            raise ValueError(
                "the visenv agent loop needs `servers` in its agent-loop config "
                f"(actor_rollout_ref.rollout.agent.agent_loop_config_path) or ${SERVERS_ENV_VAR}"
            )
        self.servers = servers if isinstance(servers, str) else [str(s) for s in servers]
        self.transport, self.token, self.timeout = transport, token, float(timeout)
        self.max_turns = max_turns
        self.max_tokens_per_turn = max_tokens_per_turn
        self.max_restarts = int(max_restarts)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        spec = EpisodeSpec.from_row(kwargs.get("extra_info"))
        shared = shared_client(self.servers, self.transport, self.token, self.timeout)
        metrics = VisenvLoopMetrics()
        reasons: list[str] = []
        while True:
            try:
                episode = await self._play(shared, spec, sampling_params, metrics)
            except RESTARTABLE as exc:
                reasons.append(f"{exc.code}: {exc.message}")
                if len(reasons) > self.max_restarts:
                    metrics.env_failed = 1
                    return await self._failed(spec, reasons, metrics)
                metrics.env_restarts += 1
                continue
            return self._output(spec, episode, metrics)

    async def _play(
        self,
        shared: SharedClient,
        spec: EpisodeSpec,
        sampling_params: dict[str, Any],
        metrics: VisenvLoopMetrics,
    ) -> _Episode:
        ep = _Episode()
        started = time.perf_counter()
        reply: SessionReply = await shared.create.submit(spec.options)
        metrics.tool_calls += time.perf_counter() - started
        try:
            await self._turns(shared, spec, reply, ep, sampling_params, metrics)
        finally:
            try:  # best effort: a lost session is gone already
                await shared.close.submit(reply.session_id)
            except VisenvError:
                pass
        return ep

    async def _turns(
        self,
        shared: SharedClient,
        spec: EpisodeSpec,
        reply: SessionReply,
        ep: _Episode,
        sampling_params: dict[str, Any],
        metrics: VisenvLoopMetrics,
    ) -> None:
        messages = [{"role": "system", "content": reply.system_prompt or ""}]
        messages.append(user_message(reply.observation))
        ep.images = [im.to_pil() for im in reply.observation.images]
        self._assert_mm_supported(bool(ep.images))
        ep.tokens = await self.ct_build_initial_tokens(messages, images=ep.images or None)
        ep.prompt_ids = list(ep.tokens)
        max_turns = spec.max_turns or self.max_turns
        turn = 0
        while max_turns is None or turn < max_turns:
            left = self.response_length - len(ep.mask)
            if left <= 0:
                break
            params = {**sampling_params, "max_tokens": min(left, self.max_tokens_per_turn or left)}
            started = time.perf_counter()
            out = await self.server_manager.generate(
                request_id=uuid4().hex,
                prompt_ids=ep.tokens,
                sampling_params=params,
                image_data=ep.images or None,
            )
            metrics.generate_sequences += time.perf_counter() - started
            if ep.logprobs is None and out.log_probs:
                ep.logprobs = []
            merged, ep.mask, logprobs = await self.ct_merge_assistant_token(
                ep.tokens, out.token_ids, ep.mask, ep.logprobs,
                assistant_logprobs=out.log_probs if ep.logprobs is not None else None,
            )  # fmt: skip
            ep.logprobs = logprobs
            ep.tokens = merged.token_ids
            ep.turn_spans.append([len(ep.mask) - len(out.token_ids), len(ep.mask)])
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            started = time.perf_counter()
            reply = await shared.step.submit((reply.session_id, text))
            metrics.tool_calls += time.perf_counter() - started
            ep.last = reply
            ep.turn_scores.append(float(reply.reward))
            turn += 1
            if reply.done or turn == max_turns:
                break
            previous = [*messages, {"role": "assistant", "content": text}]
            observed = user_message(reply.observation)
            merged, mask, logprobs = await self.ct_merge_context_msg(
                previous, [*previous, observed], ep.tokens, ep.mask, ep.logprobs
            )
            if len(mask) >= self.response_length:  # the observation does not fit: stop here
                break
            messages = [*previous, observed]
            ep.tokens, ep.mask, ep.logprobs = merged.token_ids, mask, logprobs
            ep.observations += 1
            ep.images += [im.to_pil() for im in reply.observation.images]

    def _output(
        self, spec: EpisodeSpec, ep: _Episode, metrics: VisenvLoopMetrics
    ) -> AgentLoopOutput:
        n = len(ep.mask)
        last = ep.last
        return AgentLoopOutput(
            prompt_ids=ep.prompt_ids,
            response_ids=ep.tokens[len(ep.tokens) - n :] if n else [],
            response_mask=ep.mask,
            response_logprobs=ep.logprobs,
            multi_modal_data={"images": ep.images} if ep.images else {},
            reward_score=float(sum(ep.turn_scores)),
            num_turns=1 + ep.observations + len(ep.turn_scores),  # system, user, assistant
            metrics=metrics,
            extra_fields=self._extra(
                spec, ep.turn_scores, ep.turn_spans, metrics,
                success=bool(last and last.success), done=bool(last and last.done),
            ),
        )  # fmt: skip

    async def _failed(
        self, spec: EpisodeSpec, reasons: list[str], metrics: VisenvLoopMetrics
    ) -> AgentLoopOutput:
        """A flagged output: a one-token response with mask 0, reward 0 that no loss sees."""
        text = f"visenv {spec.options.env} seed {spec.options.seed}: episode failed"
        prompt_ids = await self.ct_build_initial_tokens([{"role": "user", "content": text}])
        extra = self._extra(spec, [], [], metrics, success=False, done=False)
        extra.update(visenv_failed=True, visenv_error="; ".join(reasons))
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=[self.tokenizer.pad_token_id or 0],
            response_mask=[0],
            reward_score=0.0,
            num_turns=1,
            metrics=metrics,
            extra_fields=extra,
        )

    @staticmethod
    def _extra(
        spec: EpisodeSpec,
        turn_scores: list[float],
        turn_spans: list[list[int]],
        metrics: VisenvLoopMetrics,
        *,
        success: bool,
        done: bool,
    ) -> dict[str, Any]:
        return {
            "turn_scores": turn_scores,
            "tool_rewards": [],
            "visenv_turn_spans": turn_spans,
            "visenv_env": spec.options.env,
            "visenv_seed": spec.options.seed,
            "visenv_success": success,
            "visenv_done": done,
            "visenv_restarts": metrics.env_restarts,
            "visenv_failed": False,
            "visenv_error": None,
        }


# registered as `visenv` unless an agent-loop config file named it first: verl imports this
# module while instantiating that config's entry, and registering then would replace the
# entry (and its servers) for the loops made after
if "visenv" not in _agent_loop_registry:
    register("visenv")(VisenvAgentLoop)


def drop_failed(batch: Any) -> Any:
    """The DataProto without the samples flagged `visenv_failed` (a filter for verl's
    trainer, between generate_sequences and the advantage computation)."""
    import numpy as np

    failed = batch.non_tensor_batch.get("visenv_failed")
    if failed is None:
        return batch
    keep = np.flatnonzero(~np.asarray(failed, dtype=bool))
    return batch if len(keep) == len(batch) else batch.select_idxs(keep)
