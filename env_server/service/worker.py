"""The worker process: holds environments, parses, steps, grades and encodes.

The API process sends one message per batch call (all the items of this worker) over
a pipe (`pipe.py`; the API process's end in `pool.py`, the worker's in
`worker_process.py`, whose `worker_main` runs a `Worker` in each worker process)
and gets one message back: a list of answers in the same order. The messages,
their answers and the envelope are the worker protocol of `messages.py`; `Worker.handle`
answers a batch, dispatching each message on its type. Before its first answer a worker
says `Ready`, then pre-warms the heavy environments it was given (see `Worker.prewarm`)
one by one in a thread of its own (`Worker.prewarm_behind`), with a `Warmed` notice after
each, while its main thread answers messages: a light environment is served at once, and
only a create of an environment still warming waits for that warm-up. An environment
bound to its thread (`Environment.thread_bound`: navigation's OpenGL context) is warmed
on the main thread before `Ready` instead.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from env_server.core import registry
from env_server.core.env import SEED_LIMIT, Environment
from env_server.core.types import (
    Action,
    EnvError,
    Observation,
    Representation,
    ResponseFormat,
    plain,
)
from env_server.reasoning import (
    JudgeItem,
    ReasoningConfig,
    parse_response,
    score_turn,
    system_prompt,
    turn_prompt,
)
from env_server.reasoning.guard import response_key
from visenv import wire

from .assemble import assemble_reward
from .images import ImageCache, encode_image
from .messages import (
    SCORE_KEYS,
    Close,
    Create,
    Fork,
    Forked,
    Frame,
    ListEnv,
    Message,
    Reset,
    Step,
    Stepped,
)
from .models import EnvSpec, RewardParts, ServiceError, SessionReply

log = logging.getLogger("visenv.worker")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"


@dataclass
class WorkerSession:
    env: Environment
    env_name: str
    format: ResponseFormat
    representation: Representation
    reasoning: ReasoningConfig
    encoding: str
    seed: int
    obs: Observation
    episode: int = 0
    images: ImageCache = field(default_factory=ImageCache)
    # the latest image the session showed: what /frame serves when the current observation
    # is text only (unary feedback after an answer, a text-mode turn)
    last_image: np.ndarray | None = None
    # the JSON text of the ground truth's fixed entries, by key: (the value, its text)
    # (`_truth_json`)
    truth_texts: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.observe(self.obs)

    def observe(self, obs: Observation) -> None:
        self.obs = obs
        if obs.images:  # the last one is the newest (svg: the agent's rendering after the target)
            self.last_image = obs.images[-1]


class Worker:
    """The state of one worker process; `handle(batch)` answers a batch of messages."""

    def __init__(self) -> None:
        self.sessions: dict[str, WorkerSession] = {}
        self._classes: dict[str, type[Environment]] = {}
        self.warm: set[str] = set()  # envs whose first instance this process has made
        # envs being pre-warmed in the background (`prewarm_behind`): set once each is done
        self._warming: dict[str, threading.Event] = {}

    def preload(self, names: Sequence[str]) -> None:
        """Import the modules of these envs now (before gc.freeze), not at a first create."""
        for name in names:
            try:
                self._env_class(name)
            except Exception:  # noqa: BLE001  (unavailable or broken: a create will say so)
                pass

    def prewarm(self, names: Sequence[str]) -> dict[str, float | str]:
        """Build, reset and close one instance of each env (shader compilation, simulator
        start-up, the first instance's memory), so that no user's create pays for it.
        Seconds each took, or why it could not (an env unavailable here is skipped)."""
        took: dict[str, float | str] = {}
        for name in names:
            started = time.perf_counter()
            try:
                reason = registry.info(name).unavailable
                if reason is not None:
                    took[name] = f"unavailable here: {reason}"
                    continue
                cls = self._env_class(name)
                env = cls(cls.Config())
                try:
                    env.reset(0)
                finally:
                    env.close()
            except Exception as exc:  # noqa: BLE001  (a user's create will report it)
                took[name] = f"{type(exc).__name__}: {exc}"
                log.warning("pre-warming %s failed: %s", name, took[name])
                continue
            self.warm.add(name)
            took[name] = round(time.perf_counter() - started, 3)
            log.info("pre-warmed %s in %.2f s", name, took[name])
        return took

    def thread_bound(self, name: str) -> bool:
        """Whether `name`'s environments must live on this process's main thread."""
        try:
            return self._env_class(name).thread_bound
        except Exception:  # noqa: BLE001  (unavailable or broken: `prewarm` says why)
            return False

    def prewarm_behind(
        self, names: Sequence[str], warmed: Callable[[str, float | str], None]
    ) -> threading.Thread:
        """`prewarm` each of `names`, one by one, in a daemon thread, calling `warmed(name,
        took)` after each, while the caller goes on answering messages (a warm-up is mostly
        native code: shader compilation, simulator start-up; a sokoban step beside
        primitive_skill's warm-up took at most 0.09 s here). A create of an env still
        warming waits for it (`_create`), so no env is ever built in two threads at once."""
        for name in names:
            self._warming.setdefault(name, threading.Event())

        def run() -> None:
            for name in names:
                try:
                    took = self.prewarm([name])[name]
                finally:
                    self._warming[name].set()
                warmed(name, took)

        thread = threading.Thread(target=run, name="visenv-prewarm", daemon=True)
        thread.start()
        return thread

    def _wait_warmed(self, name: str) -> None:
        """Wait until `name` is no longer being pre-warmed in the background."""
        event = self._warming.get(name)
        if event is not None:
            event.wait()

    def _env_class(self, name: str) -> type[Environment]:
        """The class of `name`, looked up once (the registry scans entry points each time)."""
        cls = self._classes.get(name)
        if cls is None:
            cls = registry.load(name)
            reason = cls.unavailable_reason()
            if reason is not None:
                raise EnvError(f"environment {name!r} is unavailable here: {reason}", "UNAVAILABLE")
            self._classes[name] = cls
        return cls

    def handle(self, batch: Sequence[Message]) -> list[Any]:
        """The answers of a batch, in order (concurrent callers' batches arrive coalesced
        into one); a message that fails answers its own error and the others go on."""
        return [self._answer_one(message) for message in batch]

    def _answer_one(self, message: Message) -> Any:
        """Answer one message; any failure becomes that message's structured error.

        An unexpected exception (a bug) is INTERNAL with an error id that the logged
        traceback carries; a create, reset or step that fails so leaves no session behind
        (its environment is in an unknown state), and the service forgets it too.
        """
        try:
            handler = self._HANDLERS[type(message)]
        except KeyError:  # not a message: a bug in the service
            return ServiceError.internal(
                TypeError(f"not a worker message: {message!r}"), "worker message", log
            )
        try:
            return handler(self, message)
        except ServiceError as exc:
            return exc
        except EnvError as exc:
            return ServiceError(exc.code, exc.message, exc.field)
        except ValidationError as exc:
            return ServiceError.from_validation(exc)
        except Exception as exc:  # a bug in an environment: INTERNAL for this item only
            where = traceback.extract_tb(exc.__traceback__)[-1]
            op = type(message).__name__.lower()
            place = f"{op} ({os.path.basename(where.filename)}:{where.lineno})"
            error = ServiceError.internal(exc, place, log)
            if isinstance(message, Create | Reset | Step):
                self._drop(message.session_id)
            return error

    def _drop(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            try:
                session.env.close()
            except Exception:  # closing a broken env may fail too; the session is gone
                log.exception("closing the broken session %s failed", session_id)

    def _session(self, session_id: str) -> WorkerSession:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise ServiceError("NOT_FOUND", f"no session {session_id!r}", "session_id") from None

    # ---- messages -------------------------------------------------------------------
    def _env_spec(self, message: ListEnv) -> EnvSpec:
        """The listing of one env (its action space is its class's: nothing is built)."""
        name = message.name
        info = registry.info(name)
        schema: dict[str, Any] = {}
        action_space = None
        description = ""
        if info.cls is not None:
            description = info.cls.description or (info.cls.__doc__ or "").strip().split("\n")[0]
            schema = info.cls.Config.model_json_schema()
            if info.unavailable is None:
                action_space = info.cls.action_space_for(info.cls.Config()).to_json()
        return EnvSpec(
            name=name,
            description=description,
            available=info.unavailable is None,
            unavailable_reason=info.unavailable,
            config_schema=schema,
            action_space=action_space,
        )

    def _create(self, message: Create) -> SessionReply:
        """The options arrive validated, defaults filled in (`SessionOptions`); only the
        environment's config is validated here, by its class."""
        session_id, options = message.session_id, message.options
        self._wait_warmed(options.env)
        started = time.perf_counter()
        try:
            cls = self._env_class(options.env)
            config = cls.Config.model_validate(options.config)
        except ValidationError as exc:
            raise ServiceError.from_validation(exc, "config") from None
        env = cls(config)
        try:
            obs = env.reset(options.seed)
        except BaseException:
            env.close()
            raise
        session = WorkerSession(
            env=env,
            env_name=options.env,
            format=options.format,
            representation=options.representation,
            reasoning=message.reasoning,
            encoding=options.image_encoding,
            seed=options.seed,
            obs=obs,
        )
        self.sessions[session_id] = session  # registered first: a failing reply drops it
        reply = self._reply(session_id, session, None, start=True)
        if options.env not in self.warm:  # this create paid the env's warm-up here
            self.warm.add(options.env)
            reply.info["warm_up_s"] = round(time.perf_counter() - started, 3)
        return reply

    def _reset(self, message: Reset) -> SessionReply:
        session_id, seed = message.session_id, message.seed
        session = self._session(session_id)
        # unset: the next seed, past the last one (2**63 - 1) back to 0
        session.seed = (session.seed + 1) % SEED_LIMIT if seed is None else int(seed)
        session.observe(session.env.reset(session.seed))
        session.episode += 1
        return self._reply(session_id, session, message.encoding, start=True)

    def _step(self, message: Step) -> Stepped:
        """Apply one turn; its reply finished here, reward and all, unless the session's
        grader is the LLM judge (see `Stepped`)."""
        session_id, response, actions = message.session_id, message.response, message.actions
        session = self._session(session_id)
        env = session.env  # a step after the episode ended: the environment refuses it
        gt_before = session.obs.ground_truth
        score = judge_item = None
        info: dict[str, Any] = {}
        if actions is not None:  # manual play: no parsing, no format or world-model reward
            space = env.action_space  # the request's ActionModels, with the space's spelling
            parsed_actions = [
                Action(space.lookup(a.name) or a.name, tuple(a.args), a.payload) for a in actions
            ]
            transition = env.step(parsed_actions)
            parse_error = None
        else:
            parsed = parse_response(response, session.format, env.action_space, session.reasoning)
            parsed_actions = list(parsed.actions)
            transition = env.step(parsed_actions)
            parse_error = parsed.error
            score = score_turn(
                env,
                parsed,
                transition,
                gt_before,
                transition.observation.ground_truth,
                session.format,
                session.representation,
                session.reasoning,
            )
            if session.reasoning.grader != "rule":
                judge_item = JudgeItem.build(
                    env,
                    parsed,
                    gt_before,
                    transition.observation.ground_truth,
                    session.representation,
                    session.reasoning,
                    score,
                )
            info.update(score.info or {})
        session.observe(transition.observation)
        info.update(
            action_valid=parse_error is None and not transition.invalid_actions,
            actions_executed=transition.actions_executed,
            actions=[a.to_json() for a in parsed_actions],
            invalid_actions=list(transition.invalid_actions),
            parse_error=parse_error,
        )
        info.update(transition.info)
        reply = self._reply(
            session_id,
            session,
            message.encoding,
            terminated=transition.terminated,
            truncated=transition.truncated,
            success=transition.success,
            info=info,
        )
        key = None
        if response is not None and session.reasoning.guard.enabled:
            key = response_key(response)
        stepped = Stepped(reply, float(transition.reward), score, judge_item, key)
        if judge_item is None:  # finished here; a judged turn, once its scores are in
            assemble_reward(stepped, score, session.reasoning)
        return stepped

    def _close(self, message: Close) -> None:
        session_id = message.session_id
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise ServiceError("NOT_FOUND", f"no session {session_id!r}", "session_id")
        session.env.close()
        return None

    def _fork(self, message: Fork) -> Forked:
        """New sessions in the source's exact state: a fresh instance of its environment
        restored from one snapshot, the same counters, last observation and options."""
        source_id, new_ids = message.source_id, message.new_ids
        source = self._session(source_id)
        env = source.env
        try:
            snapshot = env.snapshot()
        except NotImplementedError:
            raise ServiceError(
                "FAILED_PRECONDITION",
                f"environment {source.env_name!r} can't snapshot its state, so its sessions "
                "can't be forked",
                "session_id",
            ) from None
        made: list[tuple[str, WorkerSession]] = []
        try:
            for new_id in new_ids:
                fork_env = type(env)(env.config)
                obs = copy.deepcopy(source.obs)
                fork = dataclasses.replace(
                    source, env=fork_env, obs=obs, images=ImageCache(), truth_texts={}
                )
                made.append((new_id, fork))
                fork_env.restore(snapshot)
        except BaseException:
            for _, session in made:
                session.env.close()
            raise
        self.sessions.update(made)
        return Forked(env.fork_tolerance)

    def _frame(self, message: Frame) -> bytes:
        session = self._session(message.session_id)
        if session.last_image is None:
            raise ServiceError(
                "NOT_FOUND",
                f"session {message.session_id} has shown no image (its observations are text)",
            )
        return encode_image(session.last_image, "png").data

    _HANDLERS: dict[type, Any] = {
        ListEnv: _env_spec,
        Create: _create,
        Reset: _reset,
        Step: _step,
        Close: _close,
        Fork: _fork,
        Frame: _frame,
    }

    # ---- replies --------------------------------------------------------------------
    def _reply(
        self,
        session_id: str,
        session: WorkerSession,
        encoding: str | None,
        *,
        start: bool = False,
        terminated: bool = False,
        truncated: bool = False,
        success: bool = False,
        info: dict[str, Any] | None = None,
    ) -> SessionReply:
        """The reply in the session's current state, with a zero reward: a create or reset
        earns none, and a step's is assembled after (`assemble.assemble_reward`)."""
        env, obs = session.env, session.obs
        fmt, rep, cfg = session.format, session.representation, session.reasoning
        text = turn_prompt(env, obs, fmt, rep, cfg)
        prompt = system_prompt(env, fmt, rep, cfg) if start else None
        enc = encoding or session.encoding
        images = session.images.encode(obs.images, enc)
        try:
            texts = {
                "ground_truth": _truth_json(
                    obs.ground_truth, env.fixed_ground_truth, session.truth_texts
                ),
                "info": _to_json(plain(obs.info, "observation.info")),
            }
        except ValueError:  # a non-finite number: sent as values, for `writable` to find
            ground_truth = plain(obs.ground_truth, "ground_truth")
            obs_info = plain(obs.info, "observation.info")
            observation = wire.Observation(text, images, ground_truth, obs_info)
        else:
            observation = wire.Observation.with_json(texts, text=text, images=images)
        info = plain(info or {}, "info")
        fields = {
            "session_id": session_id,
            "env": session.env_name,
            "step_index": session.env.turn,
            "episode": session.episode,
            "turn": session.env.turn,
            "observation": observation,
            "reward": 0.0,
            "reward_parts": RewardParts(),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "success": bool(success),
            "system_prompt": prompt,
        }
        # (assemble_reward puts the score keys first)
        texts = None if not SCORE_KEYS.isdisjoint(info) else _json_texts(info=info)
        if texts is None:
            return SessionReply(**fields, info=info)
        return SessionReply.with_json(texts, **fields)


# json.dumps's text (its defaults, as the gRPC reply writes it), refusing NaN and
# infinities; one encoder for every call (json.dumps builds one per call given an option).
# No check for circular references (a fifth of the time of a ground truth's text): what
# it encodes is `plain`'s output, which a cycle never gets out of (plain recurses too)
_to_json = json.JSONEncoder(allow_nan=False, check_circular=False).encode


def _truth_json(truth: Any, fixed: frozenset[str], known: dict[str, tuple[Any, str]]) -> str:
    """`_to_json(plain(truth, "ground_truth"))`, without checking and encoding again the
    entries the environment never changes in place (`fixed_ground_truth`: a room's walls,
    ~40% of a Sokoban ground truth's text): such an entry's text (`"walls": [[0, 0], ...]`)
    is kept in `known` while the ground truth holds the same object. json writes a dict as
    its entries' texts joined by ", " in braces; the entries between fixed ones are written
    by json as a dict of their own, braces cut off."""
    if not fixed or type(truth) is not dict:
        return _to_json(plain(truth, "ground_truth"))
    parts: list[str] = []
    others: dict[str, Any] = {}
    for key, value in truth.items():
        if type(key) is not str:  # plain() renames such keys: the whole dict, as before
            return _to_json(plain(truth, "ground_truth"))
        if key not in fixed:
            others[key] = value
            continue
        if others:
            parts.append(_to_json(plain(others, "ground_truth"))[1:-1])
            others = {}
        entry = known.get(key)
        if entry is None or entry[0] is not value:
            text = _to_json(plain({key: value}, "ground_truth"))[1:-1]
            entry = known[key] = (value, text)
        parts.append(entry[1])
    if others:
        parts.append(_to_json(plain(others, "ground_truth"))[1:-1])
    return "{" + ", ".join(parts) + "}"


def _json_texts(**objects: Any) -> dict[str, str] | None:
    """Each object's JSON text, as the gRPC reply writes it (`wire.JSONText`): the API
    process passes it on unread. None when one holds a non-finite number: sent as
    values then, for the service's `writable` to find."""
    try:
        return {name: _to_json(value) for name, value in objects.items()}
    except ValueError:
        return None
