"""Policy and critic models.

- `load_policy(path)`: any Hugging Face vision-language model with its processor
  (Qwen2.5-VL by default), from a local folder (or the hub where reachable).
- `build_tiny_qwen(path)`: a tiny random-weight Qwen2.5-VL (same architecture: two
  layers, a small vision tower) with a byte-level BPE tokenizer trained offline on a
  small built-in corpus, saved as an ordinary model folder. For tests and CPU demos;
  nothing is downloaded.
- `Critic`: a value model, either a separate backbone with a linear value head, or a
  value head on the policy's own last hidden state; `values[t]` = V(tokens before t).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

# Qwen's chat and vision special tokens, in the order Qwen gives them ids
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# a small corpus in the style of the environments' prompts and the agent's answers,
# so that the tiny tokenizer has merges for the words it will meet
_CORPUS = """
You are a Sokoban solver. Push every box onto a target. The player moves Up, Down, Left, Right.
You are walking on a frozen lake. Reach the goal without falling into a hole.
Actions: Up, Down, Left, Right. You can take up to 3 actions per turn, separated by commas.
<think><observation>The box is below and to the left of the player. The target is above the player.</observation>
<reasoning>I should push the box up towards the target.</reasoning>
<prediction>The box is in the same column, above the player. The player is on the target.</prediction></think>
<answer>Left, Up</answer> <answer>Down</answer> <answer>Right, Right, Up</answer>
The goal is in the same row, to the right of the player. The hole is directly below the player.
player box target wall goal hole empty floor row column above below left right same position
{"player": [2, 3], "box": [[3, 3]], "target": [[1, 3]]} # _ P X O S
Current observation: <image> Environment feedback: valid action. Reward 0.5. Turns left: 4.
moveahead moveback moveleft moveright rotateleft rotateright lookup lookdown pick place push
"""


def _train_tokenizer(vocab_size: int, corpus: list[str] | None = None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in _CORPUS.splitlines() if line] * 4
    for text in corpus or []:
        lines += [line for line in text.splitlines() if line]
    tok.train_from_iterator(lines, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )


def build_tiny_qwen(
    path: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    layers: int = 2,
    vocab_size: int = 512,
    image_pixels: int = 112 * 112,
    corpus: list[str] | None = None,
) -> Path:
    """Write a tiny random Qwen2.5-VL model and its processor to `path`; returns the path.

    `corpus`: extra texts (system prompts, example answers) the tokenizer's merges are
    learnt from, besides a small built-in one; the closer to what it will meet, the
    shorter the sequences.

    Images are resized to about `image_pixels` pixels: 112x112 gives 8x8 patches of
    14 px, merged 2x2 into 16 image tokens.
    """
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
    )

    path = Path(path)
    tokenizer = _train_tokenizer(vocab_size, corpus)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    image_processor = Qwen2VLImageProcessorPil(min_pixels=image_pixels, max_pixels=image_pixels)

    heads = 4
    head_dim = hidden_size // heads
    half = head_dim // 2
    t_section = half // 4  # like Qwen's [16, 24, 24] for a half-dimension of 64
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 2,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            max_position_embeddings=8192,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                # temporal, height, width sections of the rotary half-dimension
                "mrope_section": [
                    t_section,
                    (half - t_section) // 2,
                    half - t_section - (half - t_section) // 2,
                ],
            },
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=hidden_size,
            fullatt_block_indexes=[1],
            window_size=112,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    image_processor.save_pretrained(path)
    return path


@dataclass
class Processing:
    """The text tokenizer and the image processor of a vision-language model.

    (Not a transformers `ProcessorMixin`: that one also wants a video processor, which
    needs torchvision; the trainer lays out image tokens itself, see `trajectory.py`.)
    """

    tokenizer: Any
    image_processor: Any
    image_token: str = "<|image_pad|>"
    vision_start: str = "<|vision_start|>"
    vision_end: str = "<|vision_end|>"

    @property
    def merge_size(self) -> int:
        return int(getattr(self.image_processor, "merge_size", 2))


def load_policy(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
):
    """(model, Processing) from a local folder or a hub name."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    image_processor = AutoImageProcessor.from_pretrained(str(path), backend="pil")
    return model, Processing(tokenizer, image_processor)


def _backbone_hidden(model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """The last hidden state (batch, tokens, hidden) of a VLM's base model (no LM head)."""
    out = model(**inputs, use_cache=False)
    return out.last_hidden_state


class Critic(nn.Module):
    """V at every token: a linear head on a backbone's last hidden state.

    `values[t]` is the value of the prefix *before* token t: the head reads the hidden
    state at t - 1, just as token t's log-probability comes from the logits at t - 1
    (and as verl reads the values at the positions before the response tokens). The
    hidden state at t has already seen token t, so a value read there would depend on
    the very action it is the baseline for. Position 0 (never an action) gets 0.

    With `backbone=None` the head reads hidden states handed to it (the policy's, for
    a shared-backbone critic); otherwise it owns a separate backbone.
    """

    def __init__(self, hidden_size: int, backbone: nn.Module | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, inputs: dict[str, Any] | None = None, hidden: torch.Tensor | None = None
    ) -> torch.Tensor:
        if hidden is None:
            if self.backbone is None or inputs is None:
                raise ValueError("a shared-backbone critic needs the policy's hidden states")
            hidden = _backbone_hidden(self.backbone, inputs)
        after = self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)  # V(prefix up to t)
        return torch.cat([torch.zeros_like(after[:, :1]), after[:, :-1]], dim=1)


def hidden_size_of(model: nn.Module) -> int:
    config = model.config
    text = getattr(config, "text_config", None) or config
    return int(text.hidden_size)


def save_policy(model: nn.Module, processing: Processing, path: str | Path) -> Path:
    """Write a model folder that `load_policy` reads back."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processing.tokenizer.save_pretrained(path)
    processing.image_processor.save_pretrained(path)
    return path
