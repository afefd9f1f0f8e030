"""Reasoning options of a session (the `reasoning` session option): how the response is
parsed and prompted, and how it is rewarded.

    {"format_reward": 0.5, "beta_s": 0.5, "beta_w": 0.5,
     "action_sep": ",", "answer_tag": "answer", "prompt_example": true,
     "grader": "rule" | "judge" | "hybrid",
     "judge": {"base_url": "http://127.0.0.1:8000/v1", "model": "qwen", "api_key_env": "OPENAI_API_KEY"},
     "judge_fallback": true,
     "guard": {"enabled": true, "top_k": 5, "window": 1000, "threshold": 0.7, "penalty": 0.1}}

Unknown keys are refused (a typo never passes silently).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from env_server.core.env import REWARD_LIMIT


class JudgeConfig(BaseModel):
    """An OpenAI-compatible chat-completions endpoint used as the world-model judge.

    The API key is never part of a config: it is read from the environment variable
    named by `api_key_env` when the judge is built (no key -> no Authorization header).
    """

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(..., description="Endpoint root, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(..., description="Model name sent in each request.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Env var holding the API key.")
    temperature: float = Field(0.1, ge=0.0, le=2.0)
    max_tokens: int = Field(500, ge=1, le=8192)
    timeout_s: float = Field(15.0, gt=0, le=600, description="Timeout of one request.")
    max_retries: int = Field(3, ge=0, le=10, description="Retries after the first attempt.")
    retry_wait_s: float = Field(
        0.5, ge=0, le=60, description="First back-off wait; doubles per retry."
    )
    max_concurrency: int = Field(10, ge=1, le=1000, description="Requests in flight at once.")
    requests_per_second: float = Field(
        20.0, ge=0.01, le=100_000, description="Rate limit over all requests."
    )
    cache_size: int = Field(
        10_000, ge=0, le=1_000_000, description="Cached verdicts keyed by (state, text)."
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
            raise ValueError(
                f"base_url must be an http(s) URL such as http://host:8000/v1, got {value!r}"
            )
        return value


class GuardConfig(BaseModel):
    """The reward-hacking guard: frequent responses that score low lose a little reward."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    top_k: int = Field(5, ge=1, description="How many of the most frequent responses are watched.")
    window: int = Field(1000, ge=1, description="How many distinct responses are counted.")
    threshold: float = Field(0.7, ge=0.0, le=1.0, description="Scores below this are penalised.")
    penalty: float = Field(
        0.1, ge=0.0, le=REWARD_LIMIT, description="Amount subtracted from the turn's reward."
    )
    min_count: int = Field(2, ge=1, description="A response must be seen this often to count.")

    @model_validator(mode="after")
    def _check(self) -> GuardConfig:
        if self.top_k > self.window:
            raise ValueError(
                f"guard.top_k ({self.top_k}) must not exceed guard.window ({self.window})"
            )
        return self


class ReasoningConfig(BaseModel):
    """Parsing, prompt, format and world-model reward options (session option `reasoning`)."""

    model_config = ConfigDict(extra="forbid")

    action_sep: str = Field(
        ",",
        min_length=1,
        max_length=4,
        description="What separates the actions of one answer (VAGEN main's action_sep).",
    )
    answer_tag: Literal["answer", "action"] = Field(
        "answer",
        description="The answer's tag in VAGEN main's formats (vagen_*): its navigation "
        "writes <action>. The paper's formats always use <answer>.",
    )
    prompt_example: bool = Field(
        True, description="Whether the system prompt ends with an example response."
    )

    format_reward: float = Field(
        0.5, ge=0.0, le=REWARD_LIMIT, description="Reward for a well-formed, valid turn."
    )
    beta_s: float = Field(
        0.5, ge=0.0, le=REWARD_LIMIT, description="Weight of the observation (state) score."
    )
    beta_w: float = Field(
        0.5, ge=0.0, le=REWARD_LIMIT, description="Weight of the prediction (world-model) score."
    )
    grader: Literal["rule", "judge", "hybrid"] = "rule"
    judge: JudgeConfig | None = None
    judge_fallback: bool = Field(True, description="Use the rule-based score when the judge fails.")
    guard: GuardConfig = GuardConfig()

    @field_validator("action_sep")
    @classmethod
    def _no_tag_or_space(cls, value: str) -> str:
        if not value.strip() or any(c in value for c in "<>()"):
            raise ValueError(f"action_sep {value!r} must be visible and hold none of '<>()'")
        return value

    @model_validator(mode="after")
    def _judge_needed(self) -> ReasoningConfig:
        if self.grader != "rule" and self.judge is None:
            raise ValueError(f"grader {self.grader!r} needs a 'judge' config (base_url, model)")
        return self
