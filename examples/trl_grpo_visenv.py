"""TRL's GRPOTrainer on a visenv environment, through OpenEnv's client (no GPU needed).

    visenv serve --envs frozenlake &                      # the environments
    pip install trl openenv                               # in the trainer's venv
    python examples/trl_grpo_visenv.py --server http://127.0.0.1:8000 --model Qwen/Qwen3-0.6B
    python examples/trl_grpo_visenv.py --tiny --max-steps 1   # a random tiny model, offline, CPU

`GRPOTrainer(environment_factory=VisenvToolEnv)` makes one `VisenvToolEnv` per rollout:
its `reset(**example)` opens (once) an OpenEnv WebSocket session on the server's
/compat/openenv/{env} and answers the level as text, which TRL appends to the prompt; its
public method `move` is a tool the model calls; `get_reward()` is the episode's return,
computed by the server (environment, format and world-model rewards). FrozenLake with
`render_mode: text` puts the map in the observation text, so a text-only model can play.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from openenv.core.generic_client import GenericEnvClient

SERVER = os.environ.get("VISENV_URL", "http://127.0.0.1:8000")
ENV = os.environ.get("VISENV_ENV", "frozenlake")
INSTRUCTION = (
    "Play the level below. Call the `move` tool with your moves (comma-separated, e.g. "
    "'Right, Down') until the episode ends."
)


class VisenvToolEnv:
    """One visenv session per instance, driven as tools by TRL's GRPOTrainer."""

    server: str = SERVER
    env: str = ENV
    token: str | None = os.environ.get("VISENV_TOKEN")
    options: dict[str, Any] = {"format": "no_think", "config": {"render_mode": "text"}}

    def __init__(self) -> None:
        self._client: Any = None
        self.observation: dict[str, Any] = {}  # the last one (text, images, ground truth, ...)
        self.reward = 0.0
        self.done = False
        self.success = False

    def _connect(self) -> Any:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
            url = f"{self.server}/compat/openenv/{self.env}"
            self._client = GenericEnvClient(base_url=url, headers=headers).sync()
            self._client.connect()
        return self._client

    def reset(self, **example: Any) -> str:
        """A new episode (the example's `seed` column, if any); its first observation."""
        result = self._connect().reset(seed=example.get("seed"), **self.options)
        self.reward, self.done, self.success = 0.0, False, False
        self.observation = obs = result.observation
        return f"{obs['system_prompt']}\n\n{obs['text']}"

    def move(self, actions: str) -> str:
        """Make moves in the game.

        Args:
            actions: The moves to make in order, comma-separated, e.g. "Right, Down".

        Returns:
            What happened, and the next observation.
        """
        if self.done:
            raise ValueError("the episode is over")
        result = self._connect().step({"response": f"<answer>{actions}</answer>"})
        self.observation = result.observation
        self.reward += float(result.reward or 0.0)
        self.done = bool(result.done)
        if self.done:
            self.success = bool(self._connect().state()["success"])
        ending = " The episode is over." if self.done else ""
        return f"{result.observation['text']}\nReward: {result.reward:+.2f}.{ending}"

    def get_reward(self) -> float:
        """The episode's return so far (TRL calls this once per finished rollout)."""
        return self.reward

    def _close(self) -> None:
        """Close the session (private: TRL would expose a public method as a tool). A
        dropped connection closes it too."""
        if self._client is not None:
            self._client.close()
            self._client = None


def tiny_model_and_tokenizer() -> tuple[Any, Any]:
    """A random 1-layer Qwen3 and a small byte-level tokenizer with Qwen3's chat template
    (TRL knows how to parse its tool calls): everything offline, for a CPU smoke run."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from trl.chat_template_utils import qwen3_chat_template

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
               "<tool_response>", "</tool_response>", "<think>", "</think>"]  # fmt: skip
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([INSTRUCTION, qwen3_chat_template, '{"name": "move"}'], trainer)
    processing = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        chat_template=qwen3_chat_template,
    )
    config = Qwen3Config(
        vocab_size=len(processing), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=processing.eos_token_id,
        pad_token_id=processing.pad_token_id,
    )  # fmt: skip
    return Qwen3ForCausalLM(config), processing


def build_trainer(args: argparse.Namespace) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    VisenvToolEnv.server, VisenvToolEnv.env = args.server, args.env
    VisenvToolEnv.token = args.token or VisenvToolEnv.token
    if args.tiny:
        model, processing = tiny_model_and_tokenizer()
    else:
        model, processing = args.model, None
    n = max(args.levels, args.batch)
    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": INSTRUCTION}]] * n, "seed": list(range(n))}
    )
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch,
        num_generations=args.batch,
        max_completion_length=args.max_completion_length,
        logging_steps=1,
        report_to="none",
        use_cpu=args.tiny,
        bf16=False,
        save_strategy="no",
    )
    return GRPOTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=processing,
        environment_factory=VisenvToolEnv,
    )


def main(argv: list[str] | None = None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=SERVER, help="visenv HTTP address")
    parser.add_argument("--env", default=ENV)
    parser.add_argument("--token", default=None, help="default: $VISENV_TOKEN")
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B")
    parser.add_argument("--tiny", action="store_true", help="a random tiny model, offline")
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=4, help="rollouts per step (one group)")
    parser.add_argument("--levels", type=int, default=64, help="seeds 0..N-1")
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--output-dir", default="runs/trl_grpo_visenv")
    args = parser.parse_args(argv)
    trainer = build_trainer(args)
    trainer.train()
    return trainer


if __name__ == "__main__":
    main()
