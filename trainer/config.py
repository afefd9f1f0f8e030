"""The training configuration: pydantic models that refuse unknown or ill-typed keys.

Loaded from YAML with dotted CLI overrides (`ppo.actor_lr=1e-5 env.servers=[a:1,b:2]`);
defaults follow the VAGEN paper and its public code (value clip 0.5, entropy 0.001, KL
0.001 in the reward); where a default differs, its description says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class EnvSection(_Strict):
    servers: list[str] = Field(
        min_length=1, description="env server addresses (host:port or grpc://, http://)"
    )
    transport: Literal["grpc", "http"] = "grpc"
    token: str | None = None
    name: str = "sokoban"
    config: dict[str, Any] = Field(default_factory=dict)
    format: str = "grounding_worldmodeling"
    representation: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=dict)
    max_turns: int | None = Field(None, ge=1)
    timeout: float = Field(60.0, gt=0)
    system_prompt: bool = Field(
        True,
        description="give the policy the environment's system prompt at the start of each "
        "episode; false leaves it out of the context in rollouts and updates alike (a tiny "
        "model reads the observation sooner without 230 tokens of instructions before it)",
    )


class LoraSection(_Strict):
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )


class ModelSection(_Strict):
    path: str = Field(description="a local model folder or a hub name")
    build_tiny: bool = Field(
        False, description="write a tiny random Qwen2.5-VL to `path` if it is missing"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    critic: Literal["head", "separate"] = "separate"
    critic_path: str | None = Field(
        None, description="backbone of a separate critic (default: `path`)"
    )
    lora: LoraSection | None = None


class GenerationSection(_Strict):
    temperature: float = Field(0.7, gt=0)
    max_new_tokens: int = Field(200, ge=1)
    batch_size: int = Field(16, ge=1)
    backend: Literal["hf", "openai"] = Field(
        "hf",
        description="hf: model.generate in the trainer; openai: an OpenAI-compatible server "
        "(e.g. vLLM) that must serve the current policy weights (docs/trainer.md)",
    )
    base_url: str | None = Field(
        None, description="openai backend: API root, e.g. http://h:8001/v1"
    )
    served_model: str | None = Field(
        None, description="openai backend: model name (default: model.path)"
    )
    api_key_env: str = Field("OPENAI_API_KEY", description="openai backend: env var with the key")
    max_concurrency: int = Field(16, ge=1, description="openai backend: requests at once")
    timeout: float = Field(120.0, gt=0, description="openai backend: seconds per request")
    retries: int = Field(3, ge=0, description="openai backend: retries on 429/5xx/connection")
    skeleton: bool = Field(
        False,
        description="format guard: constrained decoding of env.format's tag skeleton (its tags "
        "once each, in order, text in every section, closed within max_new_tokens); the "
        "policy still chooses every word and the answer, and the update takes log-probs "
        "under the same mask (trainer/skeleton.py). hf backend only",
    )

    @model_validator(mode="after")
    def _openai_needs_url(self) -> GenerationSection:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("generation.backend 'openai' needs generation.base_url")
        if self.backend == "openai" and self.skeleton:
            raise ValueError(
                "generation.skeleton needs generation.backend 'hf': a server's sampler does "
                "not keep the mask every token was sampled under"
            )
        return self


class PPOSection(_Strict):
    iterations: int = Field(100, ge=1)
    episodes_per_iteration: int = Field(16, ge=1)
    group_size: int = Field(
        1, ge=1, description="episodes per level (same seed); GRPO and the filter need >1"
    )
    epochs: int = Field(1, ge=1)
    minibatch_size: int = Field(4, ge=1)
    level_pool: int | None = Field(
        None, ge=1, description="cycle over this many levels (None: a new level every episode)"
    )
    estimator: Literal["bi_level", "gae", "turn_wise", "grpo"] = Field(
        "bi_level", description="an entry of trainer.advantages.ESTIMATORS"
    )
    gamma_turn: float = Field(0.95, ge=0, le=1)
    lam_turn: float = Field(1.0, ge=0, le=1)
    gamma_token: float = Field(1.0, ge=0, le=1)
    lam_token: float = Field(1.0, ge=0, le=1)
    actor_lr: float = Field(1e-6, gt=0)
    critic_lr: float = Field(1e-5, gt=0)
    clip: float = Field(0.2, gt=0, description="PPO ratio clip, both sides")
    clip_low: float | None = Field(
        None, gt=0, lt=1, description="lower clip: ratio >= 1 - clip_low (default: clip)"
    )
    clip_high: float | None = Field(
        None,
        gt=0,
        description="upper clip: ratio <= 1 + clip_high (default: clip); StarPO-S "
        "'clip-higher' raises it (e.g. 0.28) so unlikely good tokens can gain more",
    )
    value_clip: float = Field(0.5, gt=0, description="VAGEN's (verl's) cliprange_value")
    kl_coef: float = Field(
        0.001, ge=0, description="0 turns the KL off (no reference model is built)"
    )
    kl_mode: Literal["reward", "loss"] | None = Field(
        None,
        description="reward: -kl_coef * KL added to each action token's reward (PPO, "
        "VAGEN); loss: kl_coef * KL added to the actor loss (GRPO, whose advantages "
        "ignore token rewards). None: loss under GRPO, reward otherwise",
    )
    kl_estimator: Literal["k1", "k3"] = Field(
        "k1", description="k1: log pi - log pi_ref; k3: the low-variance, always >= 0 form"
    )
    kl_unmasked: bool = Field(
        False,
        description="with generation.skeleton: the KL between the policy and the reference "
        "without the skeleton's mask. Under the mask a forced token has log-prob 0 for both, "
        "so no KL holds the policy's own writing of the tags, and PPO hands them to the mask "
        "(docs/trainer.md); unmasked, the reference's tags hold the policy's",
    )
    entropy_coef: float = Field(0.001, ge=0, description="VAGEN's (verl's) entropy_coeff")
    invalid_answer_penalty: float = Field(
        0.0,
        ge=0,
        description="format guard: subtracted (by the trainer) from the reward of every "
        "turn whose answer was not valid (the server's info.action_valid false: malformed, "
        "cut off, or an action refused); the episode goes on as before. The same for every "
        "format; 0 turns it off (the paper's rewards). docs/experiments/2026-12-04-format-grid.md",
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = Field(
        "token_mean",
        description="token_mean: every action token of the minibatch weighs the same "
        "(long answers weigh more); seq_mean_token_mean: mean over each episode's tokens, "
        "then over episodes (VAGEN's per-sequence mean; every episode weighs the same)",
    )
    max_grad_norm: float = Field(1.0, gt=0)
    whiten_advantages: bool = True
    filter_ratio: float = Field(
        1.0,
        gt=0,
        le=1,
        description="StarPO-S: keep this fraction of each iteration's level groups, those "
        "whose rewards vary most (1.0: keep all)",
    )
    filter_by: Literal["std", "max_mean"] = Field(
        "std", description="StarPO-S filter score of a group: reward std, or max - mean"
    )
    axpo: bool = Field(
        False,
        description="AXPO: resample each all-wrong level group from a fixed reasoning prefix "
        "through session fork (trainer/axpo.py); needs group_size >= 2",
    )
    axpo_samples: int | None = Field(
        None, ge=1, description="AXPO: new episodes per all-wrong group (default: group_size)"
    )
    axpo_branch: Literal["uncertainty", "last"] = Field(
        "uncertainty",
        description="AXPO: branch at the turn whose action the policy was least sure of "
        "(mean entropy), or at the last turn",
    )
    level_file: str | None = Field(
        None,
        description="train on the levels of this file (`visenv levels`, trainer/levels.py) "
        "whose success rate is within [level_success_min, level_success_max]; its seeds "
        "are played as they are",
    )
    level_success_min: float = Field(0.0, ge=0, le=1)
    level_success_max: float = Field(1.0, ge=0, le=1)

    @property
    def kl_in(self) -> str:
        """Where the KL penalty goes: 'reward' or 'loss' (see kl_mode)."""
        if self.kl_mode is not None:
            return self.kl_mode
        return "loss" if self.estimator == "grpo" else "reward"

    @model_validator(mode="after")
    def _groups_make_sense(self) -> PPOSection:
        if self.estimator == "grpo" and self.group_size < 2:
            raise ValueError(
                "ppo.group_size: GRPO compares episodes of the same level, so it needs "
                "group_size >= 2 (with 1 every advantage is 0 and nothing is learnt)"
            )
        if self.estimator == "grpo" and self.kl_mode == "reward" and self.kl_coef > 0:
            raise ValueError(
                "ppo.kl_mode: GRPO's advantages ignore token rewards, so a KL in the "
                "reward would have no effect; use kl_mode=loss (or kl_coef=0)"
            )
        if self.filter_ratio < 1 and self.group_size < 2:
            raise ValueError(
                "ppo.filter_ratio: the StarPO-S filter ranks groups by their reward "
                "spread, so it needs group_size >= 2"
            )
        if self.axpo and self.group_size < 2:
            raise ValueError(
                "ppo.axpo resamples groups where every episode of a level failed, so it "
                "needs group_size >= 2"
            )
        if self.level_success_min > self.level_success_max:
            raise ValueError("ppo.level_success_min must not exceed ppo.level_success_max")
        if self.episodes_per_iteration % self.group_size:
            raise ValueError("ppo.episodes_per_iteration must be a multiple of ppo.group_size")
        return self


class RunSection(_Strict):
    out_dir: str = "runs/visenv"
    seed: int = Field(
        0,
        ge=0,
        le=999,
        description="levels run.seed * 1e6 + i; `visenv eval` plays others (clients.eval)",
    )
    save_every: int = Field(1, ge=1)
    max_episode_attempts: int = Field(
        3,
        ge=1,
        description="runs of an episode that failed for a transient reason "
        "(lost session, unreachable server, deadline); other failures stop the run",
    )
    retry_wait: float = Field(
        1.0, ge=0, description="seconds before re-running lost episodes (doubles)"
    )
    device: str = "cpu"
    threads: int | None = Field(
        None,
        ge=1,
        description="torch's intra-op threads (None: torch's default). CPU sums are split "
        "by thread, so a run repeats its numbers exactly only at a fixed count",
    )
    deterministic: bool = Field(
        True,
        description="torch.use_deterministic_algorithms (warn-only: an op with no "
        "deterministic kernel, on a GPU, warns instead of failing)",
    )
    progress: bool = True
    save_episodes: int = Field(
        4,
        ge=0,
        description="sampled episodes of each iteration written, with their images, to "
        "run.out_dir/episodes/iter-NNNNNN.jsonl in the episode-file format "
        "(clients.episodes; the play page opens it); 0 writes none",
    )
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="under torchrun: ddp (a whole model per process) or fsdp "
        "(FSDP2: parameters, gradients and optimiser state sharded over processes)",
    )


class TrainConfig(_Strict):
    env: EnvSection
    model: ModelSection
    generation: GenerationSection = Field(default_factory=GenerationSection)
    ppo: PPOSection = Field(default_factory=PPOSection)
    run: RunSection = Field(default_factory=RunSection)

    @model_validator(mode="after")
    def _server_sends_system_prompt(self) -> TrainConfig:
        if self.generation.backend == "openai" and not self.env.system_prompt:
            raise ValueError(
                "env.system_prompt=false needs generation.backend 'hf' (the openai backend "
                "sends the system prompt to the server)"
            )
        if self.ppo.kl_unmasked and not (self.generation.skeleton and self.ppo.kl_coef > 0):
            raise ValueError(
                "ppo.kl_unmasked needs generation.skeleton and ppo.kl_coef > 0: it changes "
                "only the KL, and only where the skeleton's mask changed a token's log-prob"
            )
        if self.generation.skeleton and self.ppo.axpo:
            raise ValueError(
                "generation.skeleton does not combine with ppo.axpo: AXPO's branches are "
                "sampled from a fixed prefix without the skeleton's mask"
            )
        return self


class ConfigError(ValueError):
    """A config that can't be used; the message names the key."""


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config and apply `key.sub=value` overrides (values parsed as YAML)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config {path} must be a mapping at the top level")
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        _set_dotted(data, key.strip(), yaml.safe_load(raw))
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid config: {problems}") from exc
