"""Training config: unknown or ill-typed keys stop at start with a message naming them."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError, load_config

EXAMPLE = "examples/train_sokoban_tiny.yaml"


def test_example_config_loads_with_paper_defaults():
    cfg = load_config(EXAMPLE)
    assert cfg.ppo.estimator == "bi_level"
    assert cfg.ppo.gamma_turn == 0.95 and cfg.ppo.gamma_token == 1.0
    assert cfg.ppo.clip == 0.2 and cfg.ppo.kl_coef == 0.001
    assert cfg.generation.temperature == 0.7


def test_overrides_are_parsed_as_yaml():
    cfg = load_config(EXAMPLE, ["ppo.actor_lr=3e-6", "env.servers=[a:1, b:2]", "model.lora.r=4"])
    assert cfg.ppo.actor_lr == 3e-6
    assert cfg.env.servers == ["a:1", "b:2"]
    assert cfg.model.lora is not None and cfg.model.lora.r == 4


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"ppo\.actor_learning_rate"):
        load_config(EXAMPLE, ["ppo.actor_learning_rate=1e-5"])


def test_ill_typed_key_is_named():
    with pytest.raises(ConfigError, match=r"ppo\.iterations"):
        load_config(EXAMPLE, ["ppo.iterations=many"])
    with pytest.raises(ConfigError, match=r"ppo\.estimator"):
        load_config(EXAMPLE, ["ppo.estimator=magic"])


def test_missing_required_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: x}\n")
    with pytest.raises(ConfigError, match="env"):
        load_config(path)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(EXAMPLE, ["ppo.iterations"])


def test_system_prompt_off_needs_the_in_process_sampler():
    assert load_config(EXAMPLE).env.system_prompt is True  # the default: unchanged
    assert load_config(EXAMPLE, ["env.system_prompt=false"]).env.system_prompt is False
    server = ["generation.backend=openai", "generation.base_url=http://h:1/v1"]
    with pytest.raises(ConfigError, match=r"env\.system_prompt"):
        load_config(EXAMPLE, [*server, "env.system_prompt=false"])
