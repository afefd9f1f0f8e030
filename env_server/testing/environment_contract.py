"""The environment contract: a conformance suite any environment can reuse.

`EnvironmentContract` checks an `Environment` against the contract of `env_server.core`,
in the spirit of dm_env's `test_utils.EnvironmentTestMixin`: subclass it in a pytest test
module, say how to make the environment and give a few seeds, valid turns and bad configs,
and pytest collects every check as a test method of your class:

    from env_server.core import Action
    from env_server.testing import EnvironmentContract
    from my_package.env import MyEnv

    class TestMyEnv(EnvironmentContract):
        env_class = MyEnv
        config = {"size": 6}                         # validated by MyEnv.Config
        seeds = (0, 1, 2)                            # distinct seeds give distinct levels
        valid_turns = [[Action("Left")], [Action("Up"), Action("Up")]]  # two turns or more
        invalid_turns = [[Action("Left", args=(3,))]]  # besides an unknown action name
        bad_configs = [({"size": 0}, "size")]        # (config, the field its error names)

The checks (one test method each):

- the same seed gives the same observation text, images (pixel-equal), ground truth, info
  and rewards, on the same instance and on a fresh one; distinct seeds give distinct first
  observations;
- the oracle solves every seed's level within `oracle_max_turns` turns (default: the
  config's `max_turns`) with actions from the action space;
- `step` before `reset` and after the episode's end, and `oracle_actions` before
  `reset`, raise `EnvError` with code FAILED_PRECONDITION and the base class's wording;
  `oracle_actions` after the end is []; a negative seed raises `EnvError` with code
  INVALID_ARGUMENT;
- `action_space_for(config)` (read without building an environment) equals the built
  environment's `action_space`;
- an invalid action (an unknown name, and each of `invalid_turns`) and a turn over
  `max_per_turn` actions are normal replies that list them in `invalid_actions` (those
  over the limit in the base class's wording), never an exception; `turn` counts turns;
- a bad config raises pydantic's ValidationError whose `loc` names the field;
- `snapshot` / `restore` round-trip: after a restore, on the same instance or a fresh one,
  the same turns give the same observations and rewards;
- `describe` works in all three representations (structured is JSON), `system_prompt`
  in all five response formats, `state_prompt` in all three representations;
- observations (text, RGB uint8 images), ground truth, info, reward and flags are plain
  Python types: they survive `json.dumps` without `default=` and come back equal
  (no numpy scalars or arrays, no tuples, no non-string keys, no NaN);
- an observation already returned does not change when the environment steps on.

Hooks for environments whose checks need a looser eye:

- `assert_same_run(first, second, what)` compares two recorded runs; the default wants
  them equal. A physics simulator whose restore is close but not bit-exact overrides
  `assert_same_restored_run` and `assert_same_restored_state` (used by the snapshot check
  only; see tests/envs/test_contract.py's primitive_skill classes).
- `make_env()` (a classmethod) builds the environment (default:
  `env_class(env_class.Config(**config))`).

One environment instance per test class is shared by the checks (class-scoped fixtures),
so that a simulator's start-up cost is paid once per class; checks that need a never-reset
or second instance make one with `make_env()`. Environments that cannot snapshot set
`supports_snapshot = False` and the check wants a clear error instead.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pytest
from pydantic import ValidationError

from env_server.core import (
    Action,
    ActionKind,
    ActionSpace,
    EnvError,
    Environment,
    Observation,
    Representation,
    ResponseFormat,
    Transition,
)
from env_server.core.env import (
    EPISODE_ENDED,
    NO_EPISODE,
    ORACLE_BEFORE_RESET,
    STEP_BEFORE_RESET,
    StatePrompt,
    over_limit,
    unknown_action,
)

UNKNOWN_ACTION = "definitely_not_an_action"


# ---- helpers any test may use ------------------------------------------------------------


def assert_plain_json(value: Any, where: str = "value") -> None:
    """Fail, naming the path, unless `value` is made of plain JSON types only: dict with str
    keys, list, str, int, float (finite), bool, None; and `json.dumps` (no `default=`)
    round-trips it to an equal value."""
    _check_plain(value, where)
    text = json.dumps(value, allow_nan=False)
    assert json.loads(text) == value, f"{where} changes through JSON: {value!r:.200}"


def _check_plain(value: Any, where: str) -> None:
    kind = type(value)
    if value is None or kind in (str, bool, int):
        return
    if kind is float:
        assert math.isfinite(value), f"{where} is {value!r}, not a finite number"
        return
    if kind is dict:
        for key, item in value.items():
            assert type(key) is str, f"{where}: key {key!r} is a {type(key).__name__}, not a str"
            _check_plain(item, f"{where}.{key}")
        return
    if kind is list:
        for n, item in enumerate(value):
            _check_plain(item, f"{where}[{n}]")
        return
    raise AssertionError(
        f"{where} is a {kind.__module__}.{kind.__name__} ({value!r:.80}), not a plain JSON type"
    )


def assert_precondition_error(call, what: str, message: str | None = None) -> None:
    """`call()` must raise EnvError with code FAILED_PRECONDITION (and `message`, if given:
    the base class's wording)."""
    with pytest.raises(EnvError) as err:
        call()
    assert err.value.code == "FAILED_PRECONDITION", f"{what}: code {err.value.code!r}"
    assert err.value.message, f"{what}: the error says nothing"
    if message is not None:
        assert err.value.message == message, f"{what}: {err.value.message!r}, not {message!r}"


@dataclass
class Frame:
    """One observation as recorded: deep copies, so later steps cannot change them.

    `reward`, `flags` and `step_info` are None for the observation a reset returned.
    """

    text: str
    images: list[np.ndarray]
    ground_truth: dict[str, Any]
    info: dict[str, Any]
    reward: float | None = None
    flags: tuple[bool, bool, bool] | None = None  # terminated, truncated, success
    step_info: dict[str, Any] | None = None
    actions_executed: int | None = None
    invalid_actions: list[str] | None = None

    @classmethod
    def of(cls, result: Observation | Transition) -> Frame:
        obs = result.observation if isinstance(result, Transition) else result
        frame = cls(
            text=obs.text,
            images=[np.array(image, copy=True) for image in obs.images],
            ground_truth=copy.deepcopy(obs.ground_truth),
            info=copy.deepcopy(obs.info),
        )
        if isinstance(result, Transition):
            frame.reward = result.reward
            frame.flags = (result.terminated, result.truncated, result.success)
            frame.step_info = copy.deepcopy(result.info)
            frame.actions_executed = result.actions_executed
            frame.invalid_actions = list(result.invalid_actions)
        return frame


@dataclass
class Run:
    """A reset and the turns played after it: the frames as recorded and the objects the
    environment returned (to check that those stay unchanged)."""

    seed: int
    frames: list[Frame] = field(default_factory=list)
    returned: list[Observation | Transition] = field(default_factory=list)
    actions: list[list[Action]] = field(default_factory=list)  # the turns played
    after_end: BaseException | None = None  # what a step after the end raised, if tried
    oracle_after_end: Any = None  # what oracle_actions() answered after the end, if asked

    def add(self, result: Observation | Transition) -> Observation | Transition:
        self.frames.append(Frame.of(result))
        self.returned.append(result)
        return result

    def step(self, env: Environment, actions: list[Action]) -> Transition:
        self.actions.append(list(actions))
        return self.add(env.step(list(actions)))

    @property
    def done(self) -> bool:
        last = self.returned[-1] if self.returned else None
        return isinstance(last, Transition) and last.done


def assert_same_frames(first: list[Frame], second: list[Frame], what: str) -> None:
    """Frame by frame: equal text, pixel-equal images, equal ground truth, info, rewards."""
    assert len(first) == len(second), f"{what}: {len(first)} vs {len(second)} observations"
    for n, (a, b) in enumerate(zip(first, second, strict=True)):
        at = f"{what}, observation {n}"
        assert a.text == b.text, f"{at}: text differs:\n{a.text}\n---\n{b.text}"
        assert len(a.images) == len(b.images), f"{at}: number of images differs"
        for k, (x, y) in enumerate(zip(a.images, b.images, strict=True)):
            assert x.shape == y.shape and np.array_equal(x, y), f"{at}: image {k} differs"
        assert a.ground_truth == b.ground_truth, f"{at}: ground truth differs"
        assert a.info == b.info, f"{at}: info differs"
        assert a.reward == b.reward, f"{at}: reward {a.reward} vs {b.reward}"
        assert a.flags == b.flags, f"{at}: (terminated, truncated, success) differ"
        assert a.step_info == b.step_info, f"{at}: step info differs"
        assert a.actions_executed == b.actions_executed, f"{at}: actions executed differ"
        assert a.invalid_actions == b.invalid_actions, f"{at}: invalid actions differ"


# ---- the environment contract ---------------------------------------------------------------


class EnvironmentContract:
    """Every check of the environment contract as pytest test methods (see the module
    docstring). Subclass it in a test module with a name starting with `Test`."""

    env_class: ClassVar[type[Environment]]
    config: ClassVar[dict[str, Any]] = {}
    seeds: ClassVar[tuple[int, ...]] = (0, 1, 2)
    # turns of valid actions, played after a reset by the determinism and snapshot checks
    # (at least two, so that a snapshot can be taken after the first); play stops early when
    # the episode ends
    valid_turns: ClassVar[list[list[Action]]] = []
    # turns holding an invalid action, besides [Action(UNKNOWN_ACTION)] which every
    # environment must report
    invalid_turns: ClassVar[list[list[Action]]] = []
    # (config, field): a config the environment's Config refuses, and the field it names;
    # besides an unknown option and max_turns=0, which every environment must refuse
    bad_configs: ClassVar[list[tuple[dict[str, Any], str]]] = []
    oracle_max_turns: ClassVar[int | None] = None  # None: the config's max_turns
    supports_snapshot: ClassVar[bool] = True

    # ---- hooks ----------------------------------------------------------------------------
    @classmethod
    def make_env(cls) -> Environment:
        """A new environment of the class's config (fails, naming why, when unavailable)."""
        reason = cls.env_class.unavailable_reason()
        if reason is not None:
            pytest.fail(f"{cls.env_class.__name__} is unavailable here: {reason}")
        return cls.env_class(cls.env_class.Config.model_validate(cls.config))

    def assert_same_run(self, first: list[Frame], second: list[Frame], what: str) -> None:
        assert_same_frames(first, second, what)

    def assert_same_restored_run(self, first: list[Frame], second: list[Frame], what: str) -> None:
        """Compares the turns played after a restore with those played after the snapshot."""
        self.assert_same_run(first, second, what)

    def assert_same_restored_state(self, snapped: dict, restored: dict) -> None:
        """Compares the ground truth at the snapshot with the one right after a restore."""
        assert restored == snapped, "restore did not bring the ground truth back"

    # ---- shared fixtures ------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def env(cls) -> Iterator[Environment]:
        env = cls.make_env()
        yield env
        env.close()

    @pytest.fixture(scope="class")
    @classmethod
    def runs(cls, env: Environment) -> list[Run]:
        """Per seed: the reset and the valid turns, recorded."""
        return [cls.play(env, seed) for seed in cls.seeds]

    @pytest.fixture(scope="class")
    @classmethod
    def oracle_runs(cls, env: Environment) -> list[Run]:
        """Per seed: the oracle's episode (then empty turns until it ends, if the oracle did
        not end it within its bound) and what a step after the end raised."""
        out = []
        for seed in cls.seeds:
            run = Run(seed)
            run.add(env.reset(seed))
            for _ in range(cls.oracle_bound(env)):
                if run.done:
                    break
                run.step(env, env.oracle_actions())
            for _ in range(env.config.max_turns):
                if run.done:
                    break
                run.step(env, [])
            try:
                env.step(list(cls.valid_turns[0]) if cls.valid_turns else [])
            except BaseException as exc:  # noqa: BLE001 - handed to the test that checks it
                run.after_end = exc
            try:
                run.oracle_after_end = env.oracle_actions()
            except BaseException as exc:  # noqa: BLE001 - handed to the test that checks it
                run.oracle_after_end = exc
            out.append(run)
        return out

    @classmethod
    def oracle_bound(cls, env: Environment) -> int:
        return cls.oracle_max_turns or env.config.max_turns

    @classmethod
    def play(cls, env: Environment, seed: int, turns: list[list[Action]] | None = None) -> Run:
        """reset(seed), then `turns` (default: valid_turns) until the episode ends."""
        run = Run(seed)
        run.add(env.reset(seed))
        cls.continue_run(env, run, cls.valid_turns if turns is None else turns)
        return run

    @staticmethod
    def continue_run(env: Environment, run: Run, turns: list[list[Action]]) -> Run:
        for actions in turns:
            if run.done:
                break
            run.step(env, actions)
        return run

    # ---- the class itself -------------------------------------------------------------------
    def test_suite_is_configured(self) -> None:
        assert len(self.seeds) >= 2, "give at least two seeds"
        assert len(set(self.seeds)) == len(self.seeds), "seeds must be distinct"
        assert len(self.valid_turns) >= 2, "give at least two turns of valid actions"
        assert issubclass(self.env_class, Environment)
        assert self.env_class.name, "the environment has no name"

    def test_action_space(self, env: Environment) -> None:
        space = env.action_space
        assert space.names and len(set(space.names)) == len(space.names)
        assert space.max_per_turn >= 1
        assert_plain_json(space.to_json(), "action_space")
        for name in space.names:
            assert space.lookup(name.upper()) == name

    def test_action_space_is_readable_without_an_environment(self, env: Environment) -> None:
        declared = self.env_class.action_space_for(env.config)
        assert isinstance(declared, ActionSpace)
        assert declared == env.action_space, "action_space_for(config) != the built env's"
        default = self.env_class.action_space_for(self.env_class.Config())
        assert isinstance(default, ActionSpace)
        assert_plain_json(default.to_json(), "action_space_for(Config())")

    # ---- determinism --------------------------------------------------------------------------
    def test_same_seed_same_run(self, env: Environment, runs: list[Run]) -> None:
        """Replaying a seed (after other seeds were played) gives the recorded run again."""
        for run in reversed(runs):
            again = self.play(env, run.seed)
            self.assert_same_run(run.frames, again.frames, f"seed {run.seed} replayed")

    def test_same_seed_same_run_on_a_fresh_instance(self, runs: list[Run]) -> None:
        other = self.make_env()
        try:
            again = self.play(other, runs[0].seed)
        finally:
            other.close()
        self.assert_same_run(runs[0].frames, again.frames, f"seed {runs[0].seed}, new instance")

    def test_distinct_seeds_give_distinct_levels(self, runs: list[Run]) -> None:
        seen: dict[str, int] = {}
        for run in runs:
            first = run.frames[0]
            key = json.dumps(
                [first.text, first.ground_truth, [image.tobytes().hex() for image in first.images]]
            )
            assert key not in seen, f"seeds {seen.get(key)} and {run.seed} give the same start"
            seen[key] = run.seed

    def test_observations_stay_as_returned(self, runs: list[Run]) -> None:
        """What step/reset returned is not changed by later steps (no shared buffers)."""
        for run in runs:
            returned = [Frame.of(result) for result in run.returned]
            self.assert_same_run(run.frames, returned, f"seed {run.seed}, returned objects")

    # ---- the oracle -----------------------------------------------------------------------------
    def test_oracle_solves_every_seed(self, env: Environment, oracle_runs: list[Run]) -> None:
        bound = self.oracle_bound(env)
        for run in oracle_runs:
            last = run.returned[-1]
            assert isinstance(last, Transition), f"seed {run.seed}: the oracle took no turn"
            turns = len(run.actions)
            assert last.success and last.terminated and not last.truncated, (
                f"seed {run.seed}: not solved after {turns} turns: {last.info}"
            )
            assert turns <= bound, f"seed {run.seed}: solved in {turns} > {bound} turns"
            assert all(run.actions), f"seed {run.seed}: the oracle gave an empty turn"

    def test_oracle_actions_are_in_the_action_space(
        self, env: Environment, oracle_runs: list[Run]
    ) -> None:
        space = env.action_space
        for run in oracle_runs:
            for actions in run.actions:
                assert len(actions) <= space.max_per_turn, f"seed {run.seed}: {actions}"
                for action in actions:
                    assert isinstance(action, Action) and action.name in space.names, action
                    assert_plain_json(action.to_json(), "oracle action")

    # ---- preconditions --------------------------------------------------------------------------
    def test_step_before_reset_is_a_precondition_error(self) -> None:
        fresh = self.make_env()
        try:
            step = lambda: fresh.step(list(self.valid_turns[0]))  # noqa: E731
            assert_precondition_error(step, "step", STEP_BEFORE_RESET)
            assert_precondition_error(fresh.oracle_actions, "oracle_actions", ORACLE_BEFORE_RESET)
            assert_precondition_error(fresh.ground_truth, "ground_truth", NO_EPISODE)
        finally:
            fresh.close()

    def test_step_after_the_end_is_a_precondition_error(self, oracle_runs: list[Run]) -> None:
        for run in oracle_runs:
            error = run.after_end
            assert isinstance(error, EnvError), (
                f"seed {run.seed}: a step after the end raised {error!r}, not EnvError"
            )
            assert error.code == "FAILED_PRECONDITION", f"seed {run.seed}: code {error.code!r}"
            assert error.message == EPISODE_ENDED, f"seed {run.seed}: {error.message!r}"

    def test_oracle_after_the_end_has_no_actions(self, oracle_runs: list[Run]) -> None:
        for run in oracle_runs:
            assert run.oracle_after_end == [], f"seed {run.seed}: {run.oracle_after_end!r}"

    def test_negative_seed_is_refused(self, env: Environment) -> None:
        with pytest.raises(EnvError) as err:
            env.reset(-1)
        assert err.value.code == "INVALID_ARGUMENT"
        env.reset(self.seeds[0])  # and the environment is still usable

    # ---- invalid actions --------------------------------------------------------------------------
    def test_invalid_actions_are_reported_not_raised(self, env: Environment) -> None:
        tr: Transition | None = None
        for actions in [[Action(UNKNOWN_ACTION)], *self.invalid_turns]:
            if tr is None or tr.done:
                env.reset(self.seeds[0])
            tr = env.step(list(actions))
            assert isinstance(tr, Transition)
            names = ", ".join(a.name for a in actions)
            assert tr.invalid_actions, f"[{names}]: nothing reported invalid"
            assert all(type(m) is str and m for m in tr.invalid_actions)
            assert not tr.success, f"[{names}]: an invalid turn succeeded"
            self.check_transition_types(tr, f"invalid turn [{names}]")
        # an unknown name in a space of names is refused in the base class's words
        if env.action_space.kind is ActionKind.DISCRETE:
            env.reset(self.seeds[0])
            tr = env.step([Action(UNKNOWN_ACTION)])
            wanted = unknown_action(Action(UNKNOWN_ACTION), env.action_space)
            assert tr.invalid_actions == [wanted], tr.invalid_actions

    def test_actions_over_the_turn_limit_are_reported_not_raised(self, env: Environment) -> None:
        env.reset(self.seeds[0])
        assert env.turn == 0, f"turn {env.turn} after a reset"
        limit = env.action_space.max_per_turn
        action = self.valid_turns[0][0]
        tr = env.step([action] * (limit + 1))
        assert tr.invalid_actions, f"{limit + 1} actions in a turn of at most {limit}"
        assert tr.invalid_actions[-1] == over_limit(action, limit), tr.invalid_actions
        assert tr.actions_executed <= limit
        assert env.turn == 1, f"turn {env.turn} after one step"
        self.check_transition_types(tr, "over-long turn")

    # ---- config --------------------------------------------------------------------------------------
    def test_bad_config_names_the_field(self) -> None:
        generic = [({"no_such_option": 1}, "no_such_option"), ({"max_turns": 0}, "max_turns")]
        for bad, name in [*generic, *self.bad_configs]:
            with pytest.raises(ValidationError) as err:
                self.env_class.Config.model_validate({**self.config, **bad})
            fields = {str(e["loc"][0]) for e in err.value.errors() if e["loc"]}
            assert name in fields, f"{bad}: the error names {sorted(fields)}, not {name!r}"

    def test_config_round_trips_as_json(self, env: Environment) -> None:
        dumped = env.config.model_dump(mode="json")
        assert_plain_json(dumped, "config")
        assert self.env_class.Config.model_validate(dumped) == env.config

    # ---- snapshot / restore --------------------------------------------------------------------------
    def test_snapshot_restore_round_trip(self, env: Environment) -> None:
        if not self.supports_snapshot:
            env.reset(self.seeds[0])
            with pytest.raises((EnvError, NotImplementedError)):
                env.snapshot()
            return
        first, rest = self.valid_turns[:1], self.valid_turns[1:]
        for seed in self.seeds:  # a seed whose episode goes on after the first valid turn
            run = self.play(env, seed, first)
            if not run.done:
                break
        assert not run.done, "the first valid turn ends every seed's episode"
        state = copy.deepcopy(env.ground_truth())
        snap = env.snapshot()
        after = self.continue_run(env, Run(run.seed), rest)
        env.restore(snap)
        self.assert_same_restored_state(state, env.ground_truth())
        again = self.continue_run(env, Run(run.seed), rest)
        self.assert_same_restored_run(after.frames, again.frames, "after restore")
        fork = self.make_env()
        try:
            fork.restore(snap)
            forked = self.continue_run(fork, Run(run.seed), rest)
        finally:
            fork.close()
        self.assert_same_restored_run(after.frames, forked.frames, "restored in a new instance")

    # ---- text -------------------------------------------------------------------------------------------
    def test_describe_in_every_representation(self, env: Environment, runs: list[Run]) -> None:
        for run in runs:
            for n, frame in enumerate(run.frames):
                for rep in Representation:
                    text = env.describe(copy.deepcopy(frame.ground_truth), rep)
                    where = f"seed {run.seed}, observation {n}, {rep.value}"
                    assert type(text) is str and text.strip(), f"{where}: empty"
                    if rep is Representation.STRUCTURED:
                        json.loads(text)  # structured states are JSON

    def test_system_prompt_in_every_format(self, env: Environment) -> None:
        for fmt in ResponseFormat:
            text = env.system_prompt(fmt)
            assert type(text) is str and text.strip(), fmt
            vagen = fmt.value.startswith("vagen_")  # VAGEN main's formats: its spellings
            for name in env.action_space.names:
                shown = env.action_space.vagen_name(name) if vagen else name
                assert shown.lower() in text.lower(), f"{fmt.value}: action {shown!r} not named"

    def test_state_prompt_in_every_representation(self, env: Environment) -> None:
        for rep in Representation:
            prompt = env.state_prompt(rep)
            if prompt is None:
                continue  # the generic grid instructions apply
            assert isinstance(prompt, StatePrompt)
            for part in ("instruction", "reminder", "answer", "observation", "prediction"):
                assert type(getattr(prompt, part)) is str and getattr(prompt, part).strip(), part

    # ---- plain types ---------------------------------------------------------------------------------
    def test_everything_returned_is_plain_json(
        self, env: Environment, runs: list[Run], oracle_runs: list[Run]
    ) -> None:
        for run in [*runs, *oracle_runs]:
            for n, result in enumerate(run.returned):
                where = f"seed {run.seed}, observation {n}"
                obs = result.observation if isinstance(result, Transition) else result
                self.check_observation(obs, where)
                if isinstance(result, Transition):
                    self.check_transition_types(result, where)
        assert_plain_json(env.ground_truth(), "ground_truth()")  # of whatever state it is in

    @staticmethod
    def check_observation(obs: Observation, where: str) -> None:
        assert type(obs.text) is str, f"{where}: text is a {type(obs.text).__name__}"
        assert_plain_json(obs.ground_truth, f"{where}: ground_truth")
        assert_plain_json(obs.info, f"{where}: info")
        for k, image in enumerate(obs.images):
            assert isinstance(image, np.ndarray), f"{where}: image {k} is not an array"
            assert image.dtype == np.uint8, f"{where}: image {k} is {image.dtype}, not uint8"
            assert image.ndim == 3 and image.shape[2] == 3, f"{where}: image {k} is {image.shape}"
            assert image.shape[0] > 0 and image.shape[1] > 0

    @staticmethod
    def check_transition_types(tr: Transition, where: str) -> None:
        assert type(tr.reward) is float and math.isfinite(tr.reward), (
            f"{where}: reward {tr.reward!r} is a {type(tr.reward).__name__}"
        )
        for flag in ("terminated", "truncated", "success"):
            value = getattr(tr, flag)
            assert type(value) is bool, f"{where}: {flag} is a {type(value).__name__}"
        assert type(tr.actions_executed) is int and tr.actions_executed >= 0
        assert_plain_json(tr.invalid_actions, f"{where}: invalid_actions")
        assert_plain_json(tr.info, f"{where}: info")
        if tr.success:
            assert tr.terminated, f"{where}: success without terminated"
