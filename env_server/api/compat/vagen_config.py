"""VAGEN's env_config keys translated into visenv session options, per environment.

    options = session_options("sokoban", {"prompt_format": "wm", "format_reward": 0.1},
                              config_fields={"dim_room", ...}, seed=3)
    -> {"env": "sokoban", "seed": 3, "format": "grounding_worldmodeling",
        "reasoning": {"format_reward": 0.1}, "config": {}, "image_encoding": "png"}

Our configs refuse unknown keys, so every VAGEN key is either translated, passed on
(it is one of our own config fields), accepted because its value is what visenv does
anyway (e.g. `image_placeholder: "<image>"`), or refused with INVALID_ARGUMENT naming
`env_config.<key>` (HTTP 400 on the VAGEN routes).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from env_server.service.models import ServiceError

# VAGEN prompt formats -> ours; "wm" is current VAGEN's name for the full world-model format
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
    rules = {**COMMON, **PER_ENV.get(env, {})}
    opts = Options(env)
    for key, value in env_config.items():
        rule = rules.get(key)
        if key == "env_name":
            if value != env:
                raise _refuse(key, f"{value!r} does not match this route's environment {env!r}")
        elif key in SAME_AS_OURS:
            if value not in SAME_AS_OURS[key]:
                raise _refuse(key, f"visenv supports only {SAME_AS_OURS[key]!r}")
        elif key == "render_mode" and "render_mode" not in config_fields:
            if value != "vision":
                raise _refuse(key, f"{env} renders images only ('vision')")
        elif rule is not None:
            before = set(opts.config)
            rule(opts, value)
            for our in set(opts.config) - before:
                opts.origin[our] = key
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
    if seed is not None:
        options["seed"] = seed
    return options
