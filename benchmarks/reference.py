"""transformers' Whisper holding the very layers of a `WhisperModel` (int8 and float16 weights
included): its `generate`, long-form too, is the plain decoding voxrt's is held to and that
offline texts come from, on the same arithmetic as the model it stands beside."""

import functools

from torch import nn
from transformers import WhisperForConditionalGeneration

from voxtral.whisper.model import WhisperModel


@functools.cache
def transformers_whisper(model: WhisperModel) -> WhisperForConditionalGeneration:
    reference = (
        WhisperForConditionalGeneration.from_pretrained(model.path).to(model.device, model.dtype).eval()
    )
    # The two name their modules alike; a linear layer `model` quantized or rounded is shared.
    for name, layer in model.model.named_modules():
        target = name if name == "proj_out" else f"model.{name}"
        if name and isinstance(reference.get_submodule(target), nn.Linear) and type(layer) is not nn.Linear:
            reference.set_submodule(target, layer)
    return reference
