"""Batched episodes: many remote episodes driven by one batch policy.

    def policy(batch: list[PolicyInput]) -> list[str]:
        return [my_model.generate(p.messages()) for p in batch]

    trajectories = client.run_episodes(policy, "sokoban", seeds=range(64), concurrency=32)

Every turn makes one policy call for all live episodes and one batched step per
server. Finished episodes drop out; their sessions are reset with the next waiting
seed (so at most `concurrency` sessions exist) or closed. An episode whose session
fails (its server died: `SessionLost`) either stops the whole run (`on_error="raise"`)
or is returned with `error` set and the others go on (`on_error="record"`); it never
gets a made-up reward. A policy may likewise answer a `VisenvError` in place of one
episode's text (its model failed for that episode): that episode fails the same way.

Groups and branches (both through session fork, so every member starts from exactly the
same state, even where a reset is not seed-deterministic):

    groups = client.run_episodes(policy, "sokoban", seeds=range(16), group_size=8)
    # 8 more episodes that share groups[0]'s first 2 turns and continue from its state there
    branches = await run_branches(client, policy, groups[0], turn=2, n=8)
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tqdm.auto import tqdm

from .errors import FailedPrecondition, VisenvError
from .types import Image, Observation, RewardParts, SessionOptions, SessionReply


class SessionClient(Protocol):
    """What a rollout needs from a client: the batch session calls of `AsyncEnvClient`
    (declared here so that this module and the client do not import each other)."""

    async def create(self, options: Any, *, return_exceptions: bool = ...) -> list[Any]: ...
    async def reset(self, session_ids: Any, seeds: Any = ..., **kw: Any) -> list[Any]: ...
    async def step(self, session_ids: Any, responses: Any, **kw: Any) -> list[Any]: ...
    async def close(self, session_ids: Any) -> list[Any]: ...
    async def fork(self, session_id: str, n: int = ...) -> list[SessionReply]: ...
    async def fork_many(self, session_ids: Any, n: int, **kw: Any) -> list[Any]: ...


# failures worth running an episode again for: its session was lost (a worker died),
# the server could not be reached, or a call ran past its deadline. Anything else (a bad
# argument, a refused config, a policy that failed after its own retries) fails the
# same way again, so it is surfaced with its error instead.
TRANSIENT = frozenset({"SESSION_LOST", "UNAVAILABLE", "DEADLINE_EXCEEDED"})


@dataclass
class Turn:
    """One turn of an episode: what was shown, what the policy answered, what it got."""

    # the text shown (with "<image>" placeholders); turn 0 starts with the system prompt
    prompt: str
    images: tuple[Image, ...]
    ground_truth: dict[str, Any]  # the true state the prompt showed
    response: str
    reward: float
    reward_parts: RewardParts
    terminated: bool
    truncated: bool
    success: bool
    info: dict[str, Any]  # the step's info: action_valid, actions_executed, parse_error, ...
    policy_seconds: float  # the batch policy call this turn was part of
    step_seconds: float  # the batched step call this turn was part of


@dataclass
class Trajectory:
    """One whole episode. `error` is set (and the episode cut short) when its session
    failed; such an episode's rewards are not to be trained on."""

    episode: int  # position in the trajectories run_episodes returns
    env: str
    seed: int
    group: int = 0  # position of its seed in the seeds given (group_size members share it)
    branched_at: int | None = None  # run_branches: the turn it left its source at
    session_id: str = ""
    server: str = ""
    system_prompt: str = ""
    turns: list[Turn] = field(default_factory=list)
    final_observation: Observation | None = None
    terminated: bool = False
    truncated: bool = False  # by the env, or by run_episodes' max_turns
    success: bool = False
    error: VisenvError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def retryable(self) -> bool:
        """Failed for a reason that running the episode again may cure (see TRANSIENT)."""
        return self.error is not None and self.error.code in TRANSIENT

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.turns)


@dataclass
class PolicyInput:
    """What the policy sees for one live episode at one turn."""

    episode: int
    seed: int
    turn: int
    system_prompt: str
    observation: Observation
    history: list[Turn]  # this episode's earlier turns
    # the response must start with this text (a fixed reasoning prefix: run_branches);
    # the policy answers the whole response, prefix included
    response_prefix: str = ""

    @property
    def prompt(self) -> str:
        """This turn's text; on turn 0 the system prompt comes first."""
        return _prompt(self.system_prompt, self.observation.text, self.turn)

    @property
    def images(self) -> tuple[Image, ...]:
        return self.observation.images

    def messages(self) -> list[dict[str, Any]]:
        """The whole conversation so far as chat messages (system, then user/assistant
        turns). User content is a list of {"type": "text"} and {"type": "image",
        "image": Image} parts, split at the "<image>" placeholders."""
        msgs: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}]
        for t in self.history:
            msgs.append(
                {
                    "role": "user",
                    "content": _content(_strip_system(t.prompt, self.system_prompt), t.images),
                }
            )
            msgs.append({"role": "assistant", "content": t.response})
        msgs.append(
            {"role": "user", "content": _content(self.observation.text, self.observation.images)}
        )
        return msgs


# one response text per input, or a VisenvError for an episode the policy could not answer
Policy = Callable[[list[PolicyInput]], Sequence[str | VisenvError]]


def _prompt(system_prompt: str, text: str, turn: int) -> str:
    return f"{system_prompt}\n\n{text}" if turn == 0 and system_prompt else text


def _strip_system(prompt: str, system_prompt: str) -> str:
    head = f"{system_prompt}\n\n"
    return prompt[len(head) :] if system_prompt and prompt.startswith(head) else prompt


def _content(text: str, images: Sequence[Image]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    pieces = text.split("<image>")
    for i, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if i < len(pieces) - 1 and i < len(images):
            parts.append({"type": "image", "image": images[i]})
    return parts


@dataclass
class _Live:
    traj: Trajectory
    reply: SessionReply  # the session's latest reply (the observation to act on)
    prefix: str = ""  # the next response's fixed start (run_branches)


async def _call_policy(policy: Policy, batch: list[PolicyInput]) -> list[str | VisenvError]:
    out = policy(batch)  # a plain policy runs right here, an async one is awaited
    if inspect.isawaitable(out):
        out = await out
    out = list(out)
    if len(out) != len(batch) or not all(isinstance(s, str | VisenvError) for s in out):
        raise ValueError(
            f"the policy must return {len(batch)} strings (or VisenvErrors), one per input; "
            f"got {out!r:.200}"
        )
    for inp, text in zip(batch, out, strict=True):
        if isinstance(text, str) and not text.startswith(inp.response_prefix):
            raise ValueError(
                f"the policy's response for episode {inp.episode} must start with its "
                f"response_prefix {inp.response_prefix[:80]!r}; got {text[:80]!r}"
            )
    return out


async def _play_turn(
    client: SessionClient,
    policy: Policy,
    live: dict[str, _Live],
    max_turns: int | None,
    fail: Callable[[Trajectory, VisenvError], None],
    finished: Callable[[], None],
) -> list[str]:
    """One turn of every live episode: one policy call, one batched step. Finished or
    failed episodes leave `live`; the ids of their sessions (free to reuse or close)."""
    sids = list(live)
    batch = [
        PolicyInput(
            episode=live[s].traj.episode,
            seed=live[s].traj.seed,
            turn=len(live[s].traj.turns),
            system_prompt=live[s].traj.system_prompt,
            observation=live[s].reply.observation,
            history=live[s].traj.turns,
            response_prefix=live[s].prefix,
        )
        for s in sids
    ]
    t0 = time.perf_counter()
    answers = await _call_policy(policy, batch)
    t1 = time.perf_counter()
    freed: list[str] = []
    for sid, answer in zip(list(sids), answers, strict=True):
        live[sid].prefix = ""
        if isinstance(answer, VisenvError):  # the policy failed for this episode
            fail(live[sid].traj, answer)  # raises here when on_error="raise"
            del live[sid]
            freed.append(sid)  # its session is reused or closed by the caller
    keep = [i for i, a in enumerate(answers) if isinstance(a, str)]
    sids = [sids[i] for i in keep]
    batch = [batch[i] for i in keep]
    responses = [str(answers[i]) for i in keep]
    results = await client.step(sids, responses, return_exceptions=True) if sids else []
    t2 = time.perf_counter()

    for sid, inp, response, result in zip(sids, batch, responses, results, strict=True):
        state = live[sid]
        traj = state.traj
        if isinstance(result, VisenvError):
            del live[sid]
            fail(traj, result)
            continue
        traj.turns.append(
            Turn(
                prompt=inp.prompt,
                images=inp.observation.images,
                ground_truth=inp.observation.ground_truth,
                response=response,
                reward=result.reward,
                reward_parts=result.reward_parts,
                terminated=result.terminated,
                truncated=result.truncated,
                success=result.success,
                info=result.info,
                policy_seconds=t1 - t0,
                step_seconds=t2 - t1,
            )
        )
        state.reply = result
        traj.final_observation = result.observation
        cut = max_turns is not None and len(traj.turns) >= max_turns
        if result.done or cut:
            traj.terminated, traj.success = result.terminated, result.success
            traj.truncated = result.truncated or (cut and not result.done)
            del live[sid]
            freed.append(sid)
            finished()
    return freed


async def run_episodes(
    client: SessionClient,
    policy: Policy,
    env: str,
    seeds: Sequence[int],
    *,
    config: dict[str, Any] | None = None,
    format: str | None = None,
    representation: str | None = None,
    reasoning: dict[str, Any] | None = None,
    image_encoding: str | None = None,
    max_turns: int | None = None,
    concurrency: int | None = None,
    on_error: str = "raise",
    progress: bool | None = None,
    group_size: int = 1,
) -> list[Trajectory]:
    """Run `group_size` episodes per seed and return their trajectories, in the order of
    `seeds` (a seed's group together).

    policy: takes a list of PolicyInput (one per live episode) and returns one response
        text per input; plain or async.
    max_turns: stop an episode after this many turns (marked truncated); None: the env's limit.
    concurrency: at most this many sessions (live episodes) at once; None: all seeds at once.
        A group needs group_size of them, so at least one group runs whatever it says.
    on_error: "raise" stops at the first failed session (closing the others) and raises
        it; "record" stores the error in that trajectory and runs the rest to the end.
    progress: a progress bar over finished episodes; None shows it only on a terminal.
    group_size: k episodes per seed from one state: a session per seed is created (or a
        finished one reset), then forked k-1 times (`AsyncEnvClient.fork`). A group whose
        session or fork fails fails whole (each member carries the error).
    """
    if on_error not in ("raise", "record"):
        raise ValueError("on_error must be 'raise' or 'record'")
    if group_size < 1:
        raise ValueError("group_size must be at least 1")
    seeds = list(seeds)
    k = group_size
    trajs = [
        Trajectory(episode=g * k + j, env=env, seed=s, group=g)
        for g, s in enumerate(seeds)
        for j in range(k)
    ]
    if not seeds:
        return trajs
    slots = max(k, min(len(trajs), concurrency or len(trajs)))  # sessions at once
    waiting = list(range(len(seeds)))[::-1]  # a stack of groups: pop() gives the next one
    live: dict[str, _Live] = {}
    show = progress if progress is not None else sys.stderr.isatty()
    bar = tqdm(total=len(trajs), desc=f"{env} episodes", disable=not show, leave=False)

    def start(traj: Trajectory, result: SessionReply | VisenvError) -> None:
        if isinstance(result, VisenvError):
            fail(traj, result)
            return
        traj.session_id, traj.server = result.session_id, result.server
        traj.system_prompt = result.system_prompt
        traj.final_observation = result.observation
        live[result.session_id] = _Live(traj, result)

    def fail(traj: Trajectory, err: VisenvError) -> None:
        traj.error = err
        bar.update(1)
        if on_error == "raise":
            raise err

    def options(group: int) -> SessionOptions:
        return SessionOptions(
            env=env,
            config=config or {},
            seed=seeds[group],
            format=format,
            representation=representation,
            reasoning=reasoning or {},
            image_encoding=image_encoding,
        )

    async def start_groups(groups: list[int], replies: list[Any]) -> None:
        """The groups' first sessions are made (or reset): fork each k-1 times."""
        made = [(g, r) for g, r in zip(groups, replies, strict=True) if isinstance(r, SessionReply)]
        forks: list[Any] = [[] for _ in made]
        if k > 1 and made:
            ids = [r.session_id for _, r in made]
            forks = await client.fork_many(ids, k - 1, return_exceptions=True)
        failed = [
            (g, r) for g, r in zip(groups, replies, strict=True) if not isinstance(r, SessionReply)
        ]
        for (g, first), forked in zip(made, forks, strict=True):
            if isinstance(forked, VisenvError):
                await client.close([first.session_id])
                failed.append((g, forked))
                continue
            for traj, reply in zip(trajs[g * k : (g + 1) * k], [first, *forked], strict=True):
                start(traj, reply)
        for g, error in failed:
            for traj in trajs[g * k : (g + 1) * k]:
                fail(traj, error)

    async def refill(freed: list[str]) -> None:
        """Start waiting groups while there is room (reusing freed sessions: reset with the
        group's seed); close the freed sessions left over first, so they make room."""
        room = (slots - len(live)) // k
        groups = [waiting.pop() for _ in range(min(len(waiting), room))]
        reuse = list(zip(freed, groups, strict=False))  # as many as both have
        fresh = groups[len(reuse) :]
        unused = freed[len(reuse) :]
        if unused:
            await client.close(unused)
        if reuse:
            replies = await client.reset(
                [sid for sid, _ in reuse], [seeds[g] for _, g in reuse], return_exceptions=True
            )
            await start_groups([g for _, g in reuse], replies)
        if fresh:
            replies = await client.create([options(g) for g in fresh], return_exceptions=True)
            await start_groups(fresh, replies)

    try:
        await refill([])
        while live or waiting:
            if not live:
                await refill([])
                continue
            freed = await _play_turn(client, policy, live, max_turns, fail, lambda: bar.update(1))
            await refill(freed)
    except BaseException:
        if live:
            await asyncio.shield(client.close(list(live)))
        raise
    finally:
        bar.close()
    return trajs


async def run_branches(
    client: SessionClient,
    policy: Policy,
    source: Trajectory,
    turn: int,
    n: int,
    *,
    session_id: str | None = None,
    response_prefix: str = "",
    config: dict[str, Any] | None = None,
    format: str | None = None,
    representation: str | None = None,
    reasoning: dict[str, Any] | None = None,
    image_encoding: str | None = None,
    max_turns: int | None = None,
    on_error: str = "raise",
) -> list[Trajectory]:
    """`n` new episodes that share `source`'s first `turn` turns and go on from its state
    there with new samples: each branch's `turns` start with those turns (the same
    objects), and `branched_at` is `turn`.

    The state at `turn` comes from `session_id`, a session kept at that state (it is
    forked n times and left as it was), or else by replaying: a new session (with the
    options given here, which must be those of the source's run) steps `source`'s
    responses of the turns before `turn`; every replayed observation must equal the
    recorded one (FailedPrecondition otherwise: fork a kept session instead), and that
    session is forked n-1 times. response_prefix: the first new response of every branch
    starts with it (AXPO keeps the reasoning and resamples the action after it).
    """
    if on_error not in ("raise", "record"):
        raise ValueError("on_error must be 'raise' or 'record'")
    if not 0 <= turn <= len(source.turns) or n < 1:
        raise ValueError(f"turn must be in [0, {len(source.turns)}] and n at least 1")
    branches = [
        Trajectory(
            episode=i, env=source.env, seed=source.seed, group=source.group, branched_at=turn,
            system_prompt=source.system_prompt, turns=list(source.turns[:turn]),
        )
        for i in range(n)
    ]  # fmt: skip
    if session_id is not None:
        replies = await client.fork(session_id, n)
    else:
        options = SessionOptions(
            env=source.env, config=config or {}, seed=source.seed, format=format,
            representation=representation, reasoning=reasoning or {},
            image_encoding=image_encoding,
        )  # fmt: skip
        (first,) = await client.create(options)
        try:
            first = await _replay(client, first, source, turn)
            replies = [first, *(await client.fork(first.session_id, n - 1) if n > 1 else [])]
        except BaseException:
            await asyncio.shield(client.close([first.session_id]))
            raise
    live: dict[str, _Live] = {}
    for traj, reply in zip(branches, replies, strict=True):
        traj.session_id, traj.server = reply.session_id, reply.server
        traj.final_observation = reply.observation
        live[reply.session_id] = _Live(traj, reply, response_prefix)

    def fail(traj: Trajectory, err: VisenvError) -> None:
        traj.error = err
        if on_error == "raise":
            raise err

    try:
        while live:
            freed = await _play_turn(client, policy, live, max_turns, fail, lambda: None)
            if freed:
                await client.close(freed)
    except BaseException:
        if live:
            await asyncio.shield(client.close(list(live)))
        raise
    return branches


async def _replay(
    client: SessionClient, reply: SessionReply, source: Trajectory, turn: int
) -> SessionReply:
    """Step `source`'s responses of its turns before `turn`; check each observation."""
    for i in range(turn + 1):
        if i < len(source.turns):
            recorded = source.turns[i]
            text = _strip_system(recorded.prompt, source.system_prompt)
            truth = recorded.ground_truth
        else:
            assert source.final_observation is not None
            text, truth = source.final_observation.text, source.final_observation.ground_truth
        if reply.observation.ground_truth != truth or reply.observation.text != text:
            raise FailedPrecondition(
                f"replaying episode {source.episode} (seed {source.seed}) diverged at turn "
                f"{i}: its environment is not deterministic under these options; fork a "
                "session kept at that turn instead (session_id=...)"
            )
        if i < turn:
            (reply,) = await client.step([reply.session_id], [source.turns[i].response])
    return reply
