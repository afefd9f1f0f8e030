"""The worker protocol: the messages between the API process and a worker process.

Over the pipe of each worker go pickled envelopes ``(request_id, body)``:

    API -> worker   (request_id, [message, ...])   a batch: one or more callers' messages
    worker -> API   (request_id, [answer, ...])    one answer per message, in order
                    (request_id, ServiceError)     the worker could not read the batch

A batch is a plain list of the messages below, answered item by item: one that fails
answers its own structured error (`ServiceError`) and the others go on. Concurrent
callers' batches are coalesced by concatenation into one envelope (the service splits
the answers back by length), so a coalesced message needs no type of its own. Two
control messages travel alone: the worker's first envelope is ``(0, Ready(...))``, sent
once it has imported the modules of its environments, then one ``(0, Warmed(...))``
per environment it pre-warms (behind Ready, between messages); ``(0, Stop())`` asks it
to close its sessions and exit.

Message (API -> worker)                 answer
    ListEnv(name)                           EnvSpec
    Create(session_id, options, reasoning)  SessionReply (the validated SessionOptions and
                                            its ReasoningConfig, as the service holds them)
    Reset(session_id, seed, encoding)       SessionReply
    Step(session_id, response, actions, encoding)
                                            Stepped (the reply; its reward is assembled
                                            by the service, see `Stepped`)
    Close(session_id)                       None
    Fork(source_id, new_ids)                Forked (the new sessions in the source's
                                            state, all made or none)
    Frame(session_id)                       bytes (PNG of the last image shown)
each answer, or a `ServiceError`.

The messages are frozen, slotted dataclasses that pickle as (class, field values): a few
times cheaper than a dataclass's default pickling, which matters as they go per step.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from env_server.reasoning import JudgeItem, ReasoningConfig, TurnScore

    from .models import ActionModel, SessionOptions, SessionReply

T = TypeVar("T")


def message(cls: type[T]) -> type[T]:
    """A frozen, slotted dataclass that pickles as its class and field values."""
    cls = dataclass(frozen=True, slots=True)(cls)
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    if not names:

        def __reduce__(self):  # noqa: N807
            return (type(self), ())
    elif len(names) == 1:
        get_one = operator.attrgetter(names[0])

        def __reduce__(self):  # noqa: N807
            return (type(self), (get_one(self),))
    else:
        get = operator.attrgetter(*names)

        def __reduce__(self):  # noqa: N807
            return (type(self), get(self))

    cls.__reduce__ = __reduce__  # type: ignore[method-assign]
    return cls


# ---- API process -> worker --------------------------------------------------------
@message
class ListEnv:
    """The listing (`EnvSpec`) of one registered environment."""

    name: str


@message
class Create:
    """Make a session: build the environment and reset it with `options.seed`. The options
    and reasoning config arrive validated (defaults filled in): the worker reads them."""

    session_id: str
    options: SessionOptions
    reasoning: ReasoningConfig  # options.reasoning, validated once by the service


@message
class Reset:
    """A new episode: `seed`, or the session's last seed + 1 when None."""

    session_id: str
    seed: int | None = None
    encoding: str | None = None  # the images' encoding for this reply; None: the session's


@message
class Step:
    """One turn: a model's `response` (parsed and graded), or `actions` (manual play:
    no parsing, no reasoning reward), the request's validated `ActionModel`s."""

    session_id: str
    response: str | None = None
    actions: list[ActionModel] | None = None
    encoding: str | None = None


@message
class Close:
    session_id: str


@message
class Fork:
    """New sessions `new_ids` in the exact state of `source_id` (all made or none)."""

    source_id: str
    new_ids: tuple[str, ...]


@message
class Frame:
    """The PNG of the latest image the session showed."""

    session_id: str


@message
class Stop:
    """Close every session and exit (sent alone, not in a batch)."""


# ---- worker -> API process --------------------------------------------------------
@message
class Ready:
    """The worker's first message: its pid, and the environments it warmed before it
    (those bound to its main thread: `Environment.thread_bound`); `Warmed` notices for
    the others follow."""

    pid: int
    warmed: dict[str, float | str]


@message
class Warmed:
    """A notice (request id 0) after the worker pre-warmed one environment: the seconds it
    took, or why it failed. Workers say `Ready` first and pre-warm behind it, between
    messages, so that the server serves at once."""

    name: str
    took: float | str


# the keys of a step's info that the service puts first, from the turn's score (its values
# may be the LLM judge's): the worker's info holds none of them
SCORE_KEYS = frozenset({"observation_score", "prediction_score", "judge_error"})


@message
class Stepped:
    """A step the worker applied, its reply finished in the worker: the reward assembled
    (`assemble.assemble_reward`: its parts, their sum, the score keys first in `info`, the
    info written as JSON text, `wire.JSONText`, unless it holds a non-finite number), but
    for the reward-hacking guard's penalty, which only the API process can know (it counts
    responses over the sessions of every worker): it subtracts that, in the rare turn that
    has one, from the turn's `score` and `response_key` (`Rewards.grade`).

    A turn of a session graded by the LLM judge (`judge` set) is the exception: its reply
    comes with a zero reward, assembled by the API process once the judge's scores are in,
    from `env_reward` and the scores.
    """

    reply: SessionReply
    env_reward: float
    score: TurnScore | None = None
    judge: JudgeItem | None = None  # set when the session's grader is the LLM judge
    # the guard's key of the response (`guard.response_key`), computed by the worker in
    # parallel with the others; None when the session has no guard or the step no response
    response_key: bytes | None = None


@message
class Forked:
    """Fork's answer: what a restored copy may do differently (None: it is exact)."""

    tolerance: str | None


Message = ListEnv | Create | Reset | Step | Close | Fork | Frame
