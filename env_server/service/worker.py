"""The worker process: holds environments, parses, steps, grades and encodes.

The API process sends one message per batch call (all the items of this worker) over
a pipe and gets one message back: a list of results in the same order, each a
`SessionReply` or a `ServiceError`. Messages are pickled tuples
`(request_id, op, payload)` -> `(request_id, result)`; the first message a worker
sends is `(0, ("ready", pid, {env: seconds its pre-warming took, or why it failed}))`,
after it has pre-warmed the heavy environments it was given (see `Worker.prewarm`).

Ops and payloads:
    envs   [(name, build an instance for its action space?)] -> [EnvSpec]
    create [(session_id, SessionOptions dict)]          -> [SessionReply | ServiceError]
    reset  [(session_id, seed | None, encoding | None)] -> [SessionReply | ServiceError]
    step   [(session_id, response | None, [action dict] | None, encoding | None)]
                                                        -> [SessionReply | ServiceError]
    close  [session_id]                                 -> [None | ServiceError]
    fork   [(source_id, [new session_id])]              -> [{"tolerance"} | ServiceError]
           (n new sessions in the source's state, all made or none)
    frame  [session_id]                                 -> [png bytes | ServiceError]
    multi  [(op, payload), ...]                         -> [answer of each, in order]
           (concurrent requests the service coalesced into one message)
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import os
import pickle
import signal
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from pydantic import ValidationError

from env_server.core import registry
from env_server.core.env import Environment
from env_server.core.types import (
    Action,
    ActionSpace,
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

from .images import ImageCache, encode_image
from .models import EnvSpec, ObservationReply, RewardParts, ServiceError, SessionReply

log = logging.getLogger("visenv.worker")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"


@dataclass
class NeedsJudge:
    """A step reply whose world-model scores the LLM judge (in the API process) decides."""

    reply: SessionReply
    item: JudgeItem


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
    turn: int = 0
    done: bool = False
    images: ImageCache = field(default_factory=ImageCache)
    # the latest image the session showed: what /frame serves when the current observation
    # is text only (unary feedback after an answer, a text-mode turn)
    last_image: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.observe(self.obs)

    def observe(self, obs: Observation) -> None:
        self.obs = obs
        if obs.images:
            self.last_image = obs.images[0]


class Worker:
    """The state of one worker process; `handle(op, payload)` answers one message."""

    def __init__(self) -> None:
        self.sessions: dict[str, WorkerSession] = {}
        self._classes: dict[str, type[Environment]] = {}
        self.warm: set[str] = set()  # envs whose first instance this process has made

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

    def handle(self, op: str, payload: Any) -> Any:
        if op == "multi":  # requests coalesced into one message: answered in order
            return [self._handle_one(sub_op, sub) for sub_op, sub in payload]
        handler = {
            "envs": self._env_spec,
            "create": self._create,
            "reset": self._reset,
            "step": self._step,
            "close": self._close,
            "fork": self._fork,
            "frame": self._frame,
        }[op]
        return [self._guard(op, handler, item) for item in payload]

    def _handle_one(self, op: str, payload: Any) -> Any:
        """One request of a `multi` message; a malformed one fails alone."""
        try:
            return self.handle(op, payload)
        except Exception as exc:  # a bug in the service
            return ServiceError.internal(exc, f"op {op!r}", log)

    def _guard(self, op: str, handler, item):
        """Run one item; any failure becomes that item's structured error.

        An unexpected exception (a bug) is INTERNAL with an error id that the logged
        traceback carries; a create, reset or step that fails so leaves no session behind
        (its environment is in an unknown state), and the service forgets it too.
        """
        try:
            return handler(item)
        except ServiceError as exc:
            return exc
        except EnvError as exc:
            return ServiceError(exc.code, exc.message)
        except ValidationError as exc:
            return ServiceError.from_validation(exc)
        except Exception as exc:  # a bug in an environment: INTERNAL for this item only
            where = traceback.extract_tb(exc.__traceback__)[-1]
            place = f"{op} ({os.path.basename(where.filename)}:{where.lineno})"
            error = ServiceError.internal(exc, place, log)
            if op in ("create", "reset", "step"):
                self._drop(item[0])
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

    # ---- ops ------------------------------------------------------------------------
    def _env_spec(self, item: tuple[str, bool]) -> EnvSpec:
        """The listing of one env; `build`: make an instance if that is the only way to
        learn its action space (done for enabled envs only: a simulator may be slow to start).
        """
        name, build = item
        info = registry.info(name)
        schema: dict[str, Any] = {}
        action_space = None
        description = ""
        if info.cls is not None:
            description = info.cls.description or (info.cls.__doc__ or "").strip().split("\n")[0]
            schema = info.cls.Config.model_json_schema()
            if info.unavailable is None:
                space = getattr(info.cls, "action_space", None)
                if not isinstance(space, ActionSpace) and build:  # an instance property
                    env = info.cls(info.cls.Config())
                    space = env.action_space
                    env.close()
                if isinstance(space, ActionSpace):
                    action_space = space.to_json()
        return EnvSpec(
            name=name,
            description=description,
            available=info.unavailable is None,
            unavailable_reason=info.unavailable,
            config_schema=schema,
            action_space=action_space,
        )

    def _create(self, item: tuple[str, dict[str, Any]]) -> SessionReply:
        session_id, options = item
        started = time.perf_counter()
        try:
            cls = self._env_class(options["env"])
            config = cls.Config.model_validate(options.get("config") or {})
        except ValidationError as exc:
            raise ServiceError.from_validation(exc, "config") from None
        try:
            cfg = ReasoningConfig.model_validate(options.get("reasoning") or {})
        except ValidationError as exc:
            raise ServiceError.from_validation(exc, "reasoning") from None
        env = cls(config)
        try:
            obs = env.reset(int(options.get("seed", 0)))
        except BaseException:
            env.close()
            raise
        session = WorkerSession(
            env=env,
            env_name=options["env"],
            format=ResponseFormat(options.get("format", ResponseFormat.GROUNDING_WORLDMODELING)),
            representation=Representation(options.get("representation", Representation.NATURAL)),
            reasoning=cfg,
            encoding=options.get("image_encoding", "png"),
            seed=int(options.get("seed", 0)),
            obs=obs,
        )
        self.sessions[session_id] = session  # registered first: a failing reply drops it
        reply = self._reply(session_id, session, None, start=True)
        if options["env"] not in self.warm:  # this create paid the env's warm-up here
            self.warm.add(options["env"])
            reply.info["warm_up_s"] = round(time.perf_counter() - started, 3)
        return reply

    def _reset(self, item: tuple[str, int | None, str | None]) -> SessionReply:
        session_id, seed, encoding = item
        session = self._session(session_id)
        session.seed = session.seed + 1 if seed is None else int(seed)
        session.observe(session.env.reset(session.seed))
        session.episode += 1
        session.turn = 0
        session.done = False
        return self._reply(session_id, session, encoding, start=True)

    def _step(self, item: tuple[str, str | None, list[dict] | None, str | None]) -> SessionReply:
        session_id, response, actions, encoding = item
        session = self._session(session_id)
        if session.done:
            raise ServiceError(
                "FAILED_PRECONDITION", f"the episode of {session_id} has ended; reset the session"
            )
        env = session.env
        gt_before = session.obs.ground_truth
        parts = RewardParts()
        judge_item = None
        info: dict[str, Any] = {}
        if actions is not None:  # manual play: no parsing, no format or world-model reward
            space = env.action_space
            parsed_actions = [
                Action(
                    space.lookup(a["name"]) or a["name"],
                    tuple(a.get("args") or ()),
                    a.get("payload"),
                )
                for a in actions
            ]
            transition = env.step(parsed_actions)
            parse_error = None
            info.update(observation_score=None, prediction_score=None, judge_error=None)
        else:
            parsed = parse_response(response, session.format, env.action_space)
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
            parts.format = float(score.format)
            parts.observation, parts.prediction = world_model_parts(score, session.reasoning)
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
            info.update(
                observation_score=score.observation_score,
                prediction_score=score.prediction_score,
                judge_error=score.judge_error,
            )
            info.update(score.info or {})
        parts.env = float(transition.reward)
        session.observe(transition.observation)
        session.turn += 1
        session.done = transition.done
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
            encoding,
            parts=parts,
            terminated=transition.terminated,
            truncated=transition.truncated,
            success=transition.success,
            info=info,
        )
        return reply if judge_item is None else NeedsJudge(reply, judge_item)

    def _close(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise ServiceError("NOT_FOUND", f"no session {session_id!r}", "session_id")
        session.env.close()
        return None

    def _fork(self, item: tuple[str, list[str]]) -> dict[str, Any]:
        """New sessions in the source's exact state: a fresh instance of its environment
        restored from one snapshot, the same counters, last observation and options."""
        source_id, new_ids = item
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
                fork = dataclasses.replace(source, env=fork_env, obs=obs, images=ImageCache())
                made.append((new_id, fork))
                fork_env.restore(snapshot)
        except BaseException:
            for _, session in made:
                session.env.close()
            raise
        self.sessions.update(made)
        return {"tolerance": env.fork_tolerance}

    def _frame(self, session_id: str) -> bytes:
        session = self._session(session_id)
        if session.last_image is None:
            raise ServiceError(
                "NOT_FOUND", f"session {session_id} has shown no image (its observations are text)"
            )
        return encode_image(session.last_image, "png").data

    # ---- replies --------------------------------------------------------------------
    def _reply(
        self,
        session_id: str,
        session: WorkerSession,
        encoding: str | None,
        *,
        start: bool = False,
        parts: RewardParts | None = None,
        terminated: bool = False,
        truncated: bool = False,
        success: bool = False,
        info: dict[str, Any] | None = None,
    ) -> SessionReply:
        env, obs = session.env, session.obs
        text = turn_prompt(env, obs, session.format, session.representation)
        prompt = system_prompt(env, session.format, session.representation) if start else None
        enc = encoding or session.encoding
        parts = parts or RewardParts()
        return SessionReply(
            session_id=session_id,
            env=session.env_name,
            step_index=session.turn,
            episode=session.episode,
            turn=session.turn,
            observation=ObservationReply(
                text=text,
                images=session.images.encode(obs.images, enc),
                ground_truth=plain(obs.ground_truth, "ground_truth"),
                info=plain(obs.info, "observation.info"),
            ),
            reward=parts.total,
            reward_parts=parts,
            terminated=bool(terminated),
            truncated=bool(truncated),
            success=bool(success),
            info=plain(info or {}, "info"),
            system_prompt=prompt,
        )


def world_model_parts(score: Any, cfg: ReasoningConfig) -> tuple[float, float]:
    """TurnScore.world_model split into its observation and prediction rewards."""
    if not score.world_model:
        return 0.0, 0.0
    return (
        float(cfg.beta_s * (score.observation_score or 0.0)),
        float(cfg.beta_w * (score.prediction_score or 0.0)),
    )


def worker_main(
    conn: Connection,
    index: int,
    env_paths: dict[str, str] | None = None,
    prewarm: Sequence[str] = (),
    preload: Sequence[str] = (),
) -> None:
    """Entry point of a worker process: answer messages until the pipe closes."""
    for name, path in (env_paths or {}).items():
        registry.BUILTIN.setdefault(name, path)
    # Ctrl-C and SIGTERM to the process group reach the API process, which stops us in order
    # (and if it dies, the pipe closes and we exit)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # stderr, as the server's
    worker = Worker()
    worker.preload(preload)
    warmed = worker.prewarm(prewarm)
    # what exists now (modules, pre-warmed simulators) lives as long as the process: out of
    # every later collection (full ones over it took 100-300 ms under load: step tails)
    gc.freeze()
    conn.send_bytes(pickle.dumps((0, ("ready", os.getpid(), warmed))))
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            break
        request_id, op, payload = pickle.loads(data)
        if op == "stop":
            break
        try:
            result = worker.handle(op, payload)
        except Exception as exc:  # a malformed message: a bug in the service
            result = ServiceError.internal(exc, f"worker {index} op {op!r}", log)
        conn.send_bytes(pickle.dumps((request_id, result), protocol=pickle.HIGHEST_PROTOCOL))
    for session in worker.sessions.values():
        session.env.close()
