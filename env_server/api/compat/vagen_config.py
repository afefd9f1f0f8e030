"""VAGEN's env_config keys translated into visenv session options, per environment.

Two dialects. `main_session_options` speaks VAGEN's current branch `main` (the remote-env
adapter, vagen.py); `session_options` the `vagen-legacy` branch (vagen_legacy.py):

    options = main_session_options("sokoban", {"prompt_format": "wm", "max_steps": 100},
                                   config_fields={"dim_room", ...}, seed=3)
    -> {"env": "sokoban", "seed": 3, "format": "vagen_wm", "config": {...},
        "reasoning": {"format_reward": 0.1, "beta_s": 0.0, ...}, "image_encoding": "png"}

VAGEN main's keys are those of its env configs (github.com/mll-lab-nu/VAGEN, branch main:
SokobanEnvConfig, FrozenLakeEnvConfig, NavigationEnvConfig, PrimitiveSkillEnvConfig); a
key it leaves out takes VAGEN main's default, so that its rewards are VAGEN main's:
format_reward and success_reward as it sets them, no world-model reward unless
`use_state_reward`, and no reward shaping of Sokoban moves (VAGEN main ignores gym-sokoban's).

Our configs refuse unknown keys, so every VAGEN key is either translated, passed on
(it is one of our own config fields), accepted because its value is what visenv does
anyway (e.g. `image_placeholder: "<image>"`), or refused with INVALID_ARGUMENT naming
`env_config.<key>` (HTTP 400 on the VAGEN routes).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from env_server.core.types import ResponseFormat
from env_server.service.models import ServiceError

# vagen-legacy's prompt formats -> ours; "wm" keeps its old meaning here, the paper's full
# world-model format (on /compat/vagen, VAGEN main's, "wm" is VAGEN main's layout: MAIN_FORMATS)
FORMATS = {
    "no_think": "no_think",
    "free_think": "free_think",
    "grounding": "grounding",
    "worldmodeling": "worldmodeling",
    "grounding_worldmodeling": "grounding_worldmodeling",
    "wm": "grounding_worldmodeling",
}
REPRESENTATIONS = ("symbolic", "structured")  # legacy VAGEN's "<format>_<representation>"

# keys whose VAGEN value is what visenv does anyway: accepted with exactly these values
SAME_AS_OURS: dict[str, tuple[Any, ...]] = {
    "image_placeholder": ("<image>",),
    "action_sep": (",",),
    "special_token_list": (None, ["<think>", "</think>", "<answer>", "</answer>"]),
    "use_example_in_sys_prompt": (True,),
    "strict_format": (True,),
}


class Options:
    """The session options being built (config, format, representation, reasoning)."""

    def __init__(self, env: str) -> None:
        self.env = env
        self.config: dict[str, Any] = {}
        self.origin: dict[str, str] = {}  # our config key -> the VAGEN key it came from
        self.reasoning: dict[str, Any] = {}
        self.top: dict[str, Any] = {}
        self.state_reward: bool | None = None
        self.weights: dict[str, float] = {}


Rule = Callable[[Options, Any], None]


def _refuse(key: str, why: str) -> ServiceError:
    return ServiceError("INVALID_ARGUMENT", f"env_config.{key}: {why}", f"env_config.{key}")


def _prompt_format(opts: Options, value: Any) -> None:
    name = str(value)
    for rep in REPRESENTATIONS:
        if name.endswith("_" + rep):
            name, opts.top["representation"] = name[: -len(rep) - 1], rep
    if name not in FORMATS:
        raise _refuse("prompt_format", f"{value!r} is not one of {sorted(FORMATS)}")
    opts.top["format"] = FORMATS[name]


def _to_config(our_key: str) -> Rule:
    def rule(opts: Options, value: Any) -> None:
        opts.config[our_key] = value

    return rule


def _to_reasoning(our_key: str) -> Rule:
    def rule(opts: Options, value: Any) -> None:
        opts.reasoning[our_key] = value

    return rule


def _state_reward(opts: Options, value: Any) -> None:
    opts.state_reward = bool(value)


def _weight(our_key: str) -> Rule:
    def rule(opts: Options, value: Any) -> None:
        opts.weights[our_key] = value

    return rule


def _solution_steps(opts: Options, value: Any) -> None:
    """Current VAGEN: min_solution_steps (min, max) or None; legacy: an int (the minimum)."""
    if value is None:
        return
    if isinstance(value, int):
        opts.config["min_solution_length"] = value
        opts.config.setdefault("max_solution_length", max(value, 20))
        return
    if not (isinstance(value, list | tuple) and len(value) == 2):
        raise _refuse("min_solution_steps", "expected [min, max] or an integer")
    opts.config["min_solution_length"], opts.config["max_solution_length"] = value


def _not_slippery(opts: Options, value: Any) -> None:
    if value:
        raise _refuse("is_slippery", "visenv's FrozenLake is not slippery (the paper's setting)")


def _equal(key: str, ours: Any, why: str) -> Rule:
    """A key whose only value we can honour is `ours` (what visenv does)."""

    def rule(opts: Options, value: Any) -> None:
        if value != ours:
            raise _refuse(key, f"{why}; visenv accepts only {ours!r}")

    return rule


def _anything(opts: Options, value: Any) -> None:
    """A key with no effect on what the agent sees or earns (see where it is used)."""


COMMON: dict[str, Rule] = {
    "prompt_format": _prompt_format,
    "format_reward": _to_reasoning("format_reward"),
    "use_state_reward": _state_reward,
    "grounding_reward_weight": _weight("beta_s"),
    "worldmodeling_reward_weight": _weight("beta_w"),
    "max_actions_per_step": _to_config("max_actions_per_turn"),
}
PER_ENV: dict[str, dict[str, Rule]] = {
    "sokoban": {
        "min_solution_steps": _solution_steps,
        "min_actions_to_succeed": _solution_steps,
        "success_reward": _to_config("solved_reward"),
    },
    "frozenlake": {
        "is_slippery": _not_slippery,
        "min_actions_to_succeed": lambda opts, value: None,  # our levels: the oracle's path
    },
}


def session_options(
    env: str,
    env_config: Mapping[str, Any],
    config_fields: Collection[str],
    seed: int | None = None,
) -> dict[str, Any]:
    """SessionOptions (as a dict) for a VAGEN `env_config`; raises ServiceError naming the
    first key that can't be translated. `config_fields`: our config's own field names."""
    if not isinstance(env_config, Mapping):
        raise ServiceError("INVALID_ARGUMENT", "env_config must be an object", "env_config")
    options = _translate(env, env_config, config_fields, {**COMMON, **PER_ENV.get(env, {})})
    if seed is not None:
        options["seed"] = seed
    return options


def _translate(
    env: str, env_config: Mapping[str, Any], config_fields: Collection[str], rules: dict[str, Rule]
) -> dict[str, Any]:
    """Session options (no seed) from `env_config` by `rules`; see the module's docstring."""
    opts = Options(env)
    for key, value in env_config.items():
        rule = rules.get(key)
        if key == "env_name":
            if value != env:
                raise _refuse(key, f"{value!r} does not match this route's environment {env!r}")
        elif rule is not None:
            before = set(opts.config)
            rule(opts, value)
            for our in set(opts.config) - before:
                opts.origin[our] = key
        elif key in SAME_AS_OURS:
            if value not in SAME_AS_OURS[key]:
                raise _refuse(key, f"visenv supports only {SAME_AS_OURS[key]!r}")
        elif key == "render_mode" and "render_mode" not in config_fields:
            if value != "vision":
                raise _refuse(key, f"{env} renders images only ('vision')")
        elif key in config_fields:
            opts.config[key] = value  # one of our own config fields
            opts.origin[key] = key
        else:
            raise _refuse(
                key,
                f"{env} has no translation of VAGEN's {key!r}; "
                f"visenv's own keys: {sorted(config_fields)}",
            )
    for our, vagen in opts.origin.items():
        if our not in config_fields:
            raise _refuse(vagen, f"{env} has no counterpart of VAGEN's {vagen!r}")
    if opts.state_reward is False:
        opts.reasoning.update(beta_s=0.0, beta_w=0.0)
    elif opts.state_reward:
        opts.reasoning.update(opts.weights)
    options: dict[str, Any] = {
        "env": env,
        "config": opts.config,
        "reasoning": opts.reasoning,
        "image_encoding": "png",
        **opts.top,
    }
    return options


# ---------------------------------------------------------------- VAGEN main
# VAGEN main's prompt formats per environment (its parsers' names) -> ours
MAIN_FORMATS: dict[str, dict[str, str]] = {
    "sokoban": {"free_think": "vagen_free_think", "wm": "vagen_wm", "free_wm": "vagen_free_wm"},
    "frozenlake": {"free_think": "vagen_free_think", "wm": "vagen_wm"},
    "navigation": {
        "free_think": "vagen_free_think",
        "wm": "vagen_wm",
        "no_think": "vagen_no_think",
        "eval_mode": "vagen_eval_mode",
    },
    "primitive_skill": {"free_think": "vagen_free_think", "wm": "vagen_wm"},
}
ALL_MAIN_FORMATS = {
    "free_think": "vagen_free_think",
    "wm": "vagen_wm",
    "free_wm": "vagen_free_wm",
    "no_think": "vagen_no_think",
    "eval_mode": "vagen_eval_mode",
}
# VAGEN main's defaults of the keys that change what the agent is asked or earns
MAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "sokoban": {"prompt_format": "wm", "format_reward": 0.1, "success_reward": 1.0},
    "frozenlake": {
        "prompt_format": "free_think",
        "format_reward": 0.02,
        "success_reward": 1.0,
        "max_actions_per_step": 5,
    },
    "navigation": {
        "prompt_format": "free_think",
        "per_turn_format_reward": 0.01,
        "success_reward": 1.0,
        "action_sep": "|",
        "example_count": 0,
    },
    "primitive_skill": {
        "prompt_format": "wm",
        "format_reward": 0.1,
        "success_reward": 10.0,
        "action_sep": "|",
    },
}
# fixed in VAGEN main, not keys: navigation writes its answer in <action>; sokoban's moves
# earn nothing but the success and format rewards; no penalty for repeated answers
MAIN_FIXED_REASONING: dict[str, dict[str, Any]] = {"navigation": {"answer_tag": "action"}}
NO_GUARD = {"guard": {"enabled": False}}  # VAGEN main has no reward-hacking penalty
MAIN_FIXED_CONFIG: dict[str, dict[str, Any]] = {
    "sokoban": {"step_reward": 0.0, "box_on_target_reward": 0.0, "box_off_target_reward": 0.0},
}
FIXED_PER_TURN = {"primitive_skill": 2}  # primitives a turn, where it is not a config field


def _main_prompt_format(opts: Options, value: Any) -> None:
    allowed = MAIN_FORMATS.get(opts.env, ALL_MAIN_FORMATS)
    if value in allowed:
        opts.top["format"] = allowed[value]
    elif value in {f.value for f in ResponseFormat}:  # one of our own names, e.g. "grounding"
        opts.top["format"] = value
    else:
        raise _refuse(
            "prompt_format",
            f"{value!r} is not one of VAGEN main's {opts.env} formats {sorted(allowed)} "
            "nor one of visenv's own",
        )


def _max_actions(opts: Options, value: Any) -> None:
    fixed = FIXED_PER_TURN.get(opts.env)
    if fixed is None:
        opts.config["max_actions_per_turn"] = value
    elif value != fixed:
        raise _refuse("max_actions_per_step", f"{opts.env} takes {fixed} actions a turn, fixed")


def _example_count(opts: Options, value: Any) -> None:
    if value not in (0, 1):
        raise _refuse("example_count", "visenv's system prompt holds one example or none (0, 1)")
    opts.reasoning["prompt_example"] = value == 1


def _no_desc(opts: Options, value: Any) -> None:
    if value is not None:
        raise _refuse("desc", "visenv generates FrozenLake's map from the seed; no fixed maps")


MAIN_COMMON: dict[str, Rule] = {
    "prompt_format": _main_prompt_format,
    "format_reward": _to_reasoning("format_reward"),
    "action_sep": _to_reasoning("action_sep"),
    "use_example_in_sys_prompt": _to_reasoning("prompt_example"),
    "max_actions_per_step": _max_actions,
    "use_state_reward": _state_reward,
    "grounding_reward_weight": _weight("beta_s"),
    "worldmodeling_reward_weight": _weight("beta_w"),
    "gpu_device": _anything,  # where VAGEN's own server runs the env: the operator's choice here
}
MAIN_PER_ENV: dict[str, dict[str, Rule]] = {
    "sokoban": {
        "success_reward": _to_config("solved_reward"),
        "min_solution_steps": _solution_steps,
        # VAGEN main discards gym-sokoban's step-limit `done`, so max_steps changes nothing
        # there either; reset_seed_max_tries and min_solution_bfs_max_depth bound its level
        # search (ours has its own bounds and always finds a level)
        "max_steps": _anything,
        "reset_seed_max_tries": _anything,
        "min_solution_bfs_max_depth": _anything,
    },
    "frozenlake": {
        "success_reward": _to_config("success_reward"),
        "desc": _no_desc,
        "is_slippery": _not_slippery,
        "slip_prob": _equal("slip_prob", 0.0, "visenv's FrozenLake never slips"),
    },
    "navigation": {
        "success_reward": _to_config("success_reward"),
        "resolution": _to_config("image_size"),
        "eval_set": _to_config("task_set"),
        "max_steps": _to_config("max_actions_per_episode"),
        "success_threshold": _to_config("success_distance"),
        "per_turn_format_reward": _to_reasoning("format_reward"),
        "format_reward": _equal(
            "format_reward",
            0.0,
            "visenv has no end-of-episode format bonus (VAGEN main's "
            "navigation format_reward); per_turn_format_reward is its per-turn one",
        ),
        "example_count": _example_count,
        "down_sample_ratio": _equal(
            "down_sample_ratio", 1.0, "visenv generates each task from the seed; no task list"
        ),
        "multiview": _equal("multiview", False, "visenv renders the first-person view only"),
        "step_length": _equal("step_length", 0.5, "visenv's moves are 0.5 m"),
    },
    "primitive_skill": {
        "success_reward": _to_config("success_reward"),
        "env_id": _to_config("task"),
        "max_steps": _to_config("max_primitives"),
        "record_video": _equal("record_video", False, "visenv records no videos"),
        "video_record_dir": _anything,  # used only when record_video is true
        "mask_success": _equal("mask_success", True, "visenv never shows the success flag"),
    },
}


def main_session_options(
    env: str,
    env_config: Mapping[str, Any],
    config_fields: Collection[str],
    seed: int | None = None,
) -> dict[str, Any]:
    """SessionOptions (as a dict) for VAGEN main's `env_config` of `env`; raises
    ServiceError naming the first key that can't be honoured."""
    if not isinstance(env_config, Mapping):
        raise ServiceError("INVALID_ARGUMENT", "env_config must be an object", "env_config")
    rules = {**MAIN_COMMON, **MAIN_PER_ENV.get(env, {})}
    full = {"use_state_reward": False, **MAIN_DEFAULTS.get(env, {}), **env_config}
    options = _translate(env, full, config_fields, rules)
    options["config"] = {**MAIN_FIXED_CONFIG.get(env, {}), **options["config"]}
    fixed = {**NO_GUARD, **MAIN_FIXED_REASONING.get(env, {})}
    options["reasoning"] = {**fixed, **options["reasoning"]}
    if seed is not None:
        options["seed"] = seed
    return options
