"""Qwen2.5-VL's processor without its video processor, for the tiny test model.

transformers' own wants a video processor, which needs torchvision; PyPI has no CPU build
of torchvision for torch 2.13 here. The model folder ships this file (remote code,
`trust_remote_code=True`): the same class name, so verl binds Qwen2.5-VL's rope index to it.
"""

from transformers import ProcessorMixin
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor as _Qwen


class Qwen2_5_VLProcessor(_Qwen):  # noqa: N801 (verl matches the class name)
    image_processor_class = "Qwen2VLImageProcessorPil"

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
