"""The tiny random-weight Qwen2.5-VL (`trainer.model.build_tiny_qwen`) as verl loads a
model, and a server manager that generates from it on CPU.

- `build_model_folder(path)`: the tiny model with Qwen2-VL's chat template and a processor
  that verl's `hf_processor` loads (tests_verl/tiny_processor.py, as remote code).
- `HFServerManager`: what verl's agent loops call as `self.server_manager.generate(...)`
  (verl's LLMServerClient: prompt ids and images in, `TokenOutput` out), answered by
  Hugging Face `generate` on the tiny model instead of vLLM/SGLang on GPUs: the only
  stand-in of the verl tests. Requests that arrive while a batch is generating go
  together in the next one (as an inference server batches them); each answer carries
  the sampled token ids and their log-probs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent

# Qwen2-VL's chat template (an image part renders as vision_start, image_pad, vision_end)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# a random model would now and then sample these; an image token it wrote would have no image
SUPPRESSED = [
    "<|im_start|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def build_model_folder(path: str | Path, corpus: list[str] | None = None) -> Path:
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    from trainer.model import build_tiny_qwen

    path = build_tiny_qwen(path, corpus=corpus)
    import sys

    sys.path.insert(0, str(HERE))
    try:
        from tiny_processor import Qwen2_5_VLProcessor
    finally:
        sys.path.remove(str(HERE))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
    Qwen2_5_VLProcessor(image_processor, tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(
        path
    )
    shutil.copy(HERE / "tiny_processor.py", path / "tiny_processor.py")
    config_path = path / "processor_config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoProcessor": "tiny_processor.Qwen2_5_VLProcessor"}
    config_path.write_text(json.dumps(config, indent=2))
    return path


class HFServerManager:
    """verl's server-manager interface over HF generate (see the module docstring).

    `generations` keeps every answer's token ids, by request, in order (what the tests
    compare the agent loop's mask-1 tokens with); `batches` counts generate calls."""

    def __init__(self, path: str | Path, max_batch: int = 64, seed: int = 0) -> None:
        from transformers import (
            AutoTokenizer,
            Qwen2_5_VLForConditionalGeneration,
            Qwen2VLImageProcessorPil,
        )

        torch.manual_seed(seed)
        self.model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(path)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(path))
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.suppressed = self.tokenizer.convert_tokens_to_ids(SUPPRESSED)
        self.max_batch = max_batch
        self.generations: list[list[int]] = []
        self.batches = 0
        self.seconds = 0.0
        self._pending: list[tuple[list[int], dict, list, asyncio.Future]] = []
        self._runner: asyncio.Task | None = None

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        **kwargs: Any,
    ):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((list(prompt_ids), sampling_params, list(image_data or []), future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        return await future

    async def _run(self) -> None:
        from verl.workers.rollout.replica import TokenOutput

        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(0)  # requests made in this tick join the batch
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            started = loop.time()
            try:
                answers = await loop.run_in_executor(None, self._generate, batch)
            except Exception as exc:
                for *_, future in batch:
                    future.set_exception(exc)
                continue
            self.seconds += loop.time() - started
            self.batches += 1
            for (*_, future), (ids, logprobs) in zip(batch, answers, strict=True):
                self.generations.append(ids)
                future.set_result(
                    TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")
                )

    @torch.no_grad()
    def _generate(self, batch: list) -> list[tuple[list[int], list[float]]]:
        width = max(len(p) for p, *_ in batch)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p, *_ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, *_ in batch])
        images = [im for _, _, ims, _ in batch for im in ims]
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if images:
            pixels = self.image_processor(images=images, return_tensors="pt")
            inputs.update(
                pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"]
            )
        params = batch[0][1]
        temperature = float(params.get("temperature", 1.0))
        limits = [int(sp.get("max_tokens", 64)) for _, sp, _, _ in batch]
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature > 0
            else {"do_sample": False}
        )
        out = self.model.generate(
            **inputs,
            max_new_tokens=max(limits),
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            suppress_tokens=self.suppressed,
            output_scores=True,
            return_dict_in_generate=True,
            **sampling,
        )
        answers = []
        for row, limit in enumerate(limits):
            tokens = out.sequences[row, width:].tolist()[:limit]
            if self.eos_id in tokens:
                tokens = tokens[: tokens.index(self.eos_id) + 1]
            logprobs = [
                float(torch.log_softmax(out.scores[t][row].float(), -1)[token])
                for t, token in enumerate(tokens)
            ]
            answers.append((tokens, logprobs))
        return answers
