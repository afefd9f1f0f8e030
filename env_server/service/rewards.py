"""Rewards: what a step's reward needs in the API process.

A step's reward is assembled by one function, `assemble.assemble_reward`, which the worker
calls as it finishes a step's reply. The API process subtracts the reasoning guard's
penalty in the rare turn that has one (`assemble.with_penalty`: the guard counts
responses over every worker's sessions), and assembles the reward itself only for a
session graded by the LLM judge, once the judge's scores are in. `Rewards` holds the
judges (one per distinct judge config) and the guards (one per distinct guard config; a
fork gets its own copy) and grades the steps a worker applied (`Rewards.grade`).
`writable` is what a reply with a non-finite number becomes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from env_server.reasoning import Judge, ReasoningConfig, ResponseGuard, TurnScore

from .assemble import assemble_reward, with_penalty
from .messages import Stepped
from .models import RewardParts, ServiceError, SessionReply, StepItem, nonfinite_places

if TYPE_CHECKING:
    from .calls import Sent
    from .sessions import Session

log = logging.getLogger("visenv.service")


class Rewards:
    """The judges and guards of one service, and the grading of applied steps."""

    def __init__(self, judge_urls: Sequence[str] | None = None) -> None:
        self.judge_urls = list(judge_urls or [])  # the judge endpoints the operator allows
        self._judges: dict[str, Judge] = {}  # one per distinct judge config
        self._guards: dict[str, ResponseGuard] = {}  # one per distinct guard config

    async def aclose(self) -> None:
        await asyncio.gather(*(j.aclose() for j in self._judges.values()), return_exceptions=True)

    def check_judge(self, reasoning: ReasoningConfig) -> ServiceError | None:
        """A judge endpoint must be one the operator allowed: the server sends requests
        (with an API key from its own environment) to it, so a client must not be able to
        point it anywhere (server-side request forgery, key leaks)."""
        judge = reasoning.judge
        if judge is None:
            return None
        allowed = self.judge_urls
        if not any(judge.base_url.rstrip("/").startswith(u.rstrip("/")) for u in allowed):
            return ServiceError(
                "INVALID_ARGUMENT",
                f"reasoning.judge.base_url {judge.base_url!r} is not an allowed judge endpoint; "
                "the server operator lists those in VISENV_JUDGE_URLS "
                f"(now: {', '.join(allowed) or 'none'})",
                "reasoning.judge.base_url",
            )
        if judge.api_key_env.startswith("VISENV_"):
            return ServiceError(
                "INVALID_ARGUMENT",
                "reasoning.judge.api_key_env may not name the server's own VISENV_* settings",
                "reasoning.judge.api_key_env",
            )
        return None

    async def grade(self, group: Sequence[Sent], answers: list) -> list:
        """Finish the steps a worker applied (`Stepped`): the guard's penalty on every turn,
        and for a session graded by the LLM judge, the judge's scores and the reward,
        assembled by `assemble_reward`."""
        scores = [a.score if isinstance(a, Stepped) else None for a in answers]
        by_judge: dict[str, list[int]] = {}
        for n, answer in enumerate(answers):
            if isinstance(answer, Stepped) and answer.judge is not None:
                key = answer.judge.cfg.judge.model_dump_json()
                if key not in self._judges:
                    self._judges[key] = Judge(answer.judge.cfg.judge)
                by_judge.setdefault(key, []).append(n)

        async def judge(key: str, todo: list[int]) -> None:
            judged = await self._judges[key].score_batch([answers[n].judge for n in todo])
            for n, score in zip(todo, judged, strict=True):
                scores[n] = score

        if by_judge:
            await asyncio.gather(*(judge(k, todo) for k, todo in by_judge.items()))
        for n, (sent, answer) in enumerate(zip(group, answers, strict=True)):
            if isinstance(answer, Stepped):
                item, session = sent.item, sent.session
                penalty = self.penalty(item, session, scores[n], answer.response_key)
                if answer.judge is not None:  # assembled here, with the judge's scores
                    answers[n] = assemble_reward(answer, scores[n], session.reasoning, penalty)
                else:  # the worker's, finished but for the guard's penalty (rarely any)
                    answers[n] = with_penalty(answer.reply, penalty)
        return answers

    def penalty(
        self, item: StepItem, session: Session, score: TurnScore | None, key: bytes | None = None
    ) -> float:
        """The reasoning guard's penalty (>= 0) on a step's response, judged by the mean of
        its world-model scores; 0 without a guard, a response or any score."""
        if score is None or item.response is None or not session.reasoning.guard.enabled:
            return 0.0
        graded = [s for s in (score.observation_score, score.prediction_score) if s is not None]
        if not graded:
            return 0.0  # nothing graded: nothing a policy could game
        guard, mean = self.guard_of(session), sum(graded) / len(graded)
        if key is None:  # (the worker computes it: `Stepped.response_key`)
            return guard.penalty(item.response, mean)
        return guard.penalty_of_key(key, mean)

    def guard_of(self, session: Session) -> ResponseGuard:
        """The session's reasoning guard: a fork's own copy, else the one of its config
        (looked up once, then remembered on the session)."""
        if session.guard is None:
            key = session.reasoning.guard.model_dump_json()
            guard = self._guards.get(key)
            if guard is None:
                guard = self._guards[key] = ResponseGuard(session.reasoning.guard)
            session.guard = guard
        return session.guard

    def fork_guard(self, source: Session, fork: Session) -> None:
        """Give a fork its own copy of its source's guard (its window so far)."""
        if source.reasoning.guard.enabled:
            fork.guard = self.guard_of(source).copy()


def _unless_text(holder: Any, name: str, where: str) -> Iterator[str]:
    if holder.json_text(name) is None:
        yield from nonfinite_places(getattr(holder, name), where)


def writable(reply: SessionReply) -> tuple[SessionReply, SessionReply | ServiceError]:
    """(what the session keeps, what the caller gets) for a reply from a worker.

    A reply whose numbers are all finite is both. One with a NaN or an infinity (an
    environment's bug: requests carry none) can't be written as JSON: the caller gets
    INTERNAL with an error id (the log has the places), and the session keeps a copy with
    those numbers as null (a reward part: 0, the places listed in info.unwritable), so
    that it stays readable (GET, a retry, a fork) and can go on."""
    if reply.wire_bytes() is not None:  # as its worker wrote it: all finite
        return reply, reply
    # (a part that came as JSON text, `wire.JSONText`, has none: the worker wrote it so)
    obs = reply.observation
    bad = [
        *nonfinite_places(reply.reward, "reward"),
        *nonfinite_places(reply.reward_parts.to_json(), "reward_parts"),
        *_unless_text(obs, "ground_truth", "observation.ground_truth"),
        *_unless_text(obs, "info", "observation.info"),
        *_unless_text(reply, "info", "info"),
    ]
    if not bad:
        return reply, reply
    error = ServiceError.internal(
        ValueError(f"non-finite numbers at {', '.join(bad)}"),
        f"the reply of {reply.session_id}",
        log,
    )

    def scrub(value: Any) -> Any:
        return json.loads(json.dumps(value), parse_constant=lambda _: None)

    parts = RewardParts(
        **{k: v if math.isfinite(v) else 0.0 for k, v in reply.reward_parts.to_json().items()}
    )
    observation = dataclasses.replace(
        reply.observation,
        ground_truth=scrub(reply.observation.ground_truth),
        info=scrub(reply.observation.info),
    )
    stored = dataclasses.replace(
        reply,
        observation=observation,
        reward_parts=parts,
        reward=parts.total,
        info={**scrub(reply.info), "unwritable": {"error_id": error.error_id, "fields": bad}},
    )
    return stored, error
