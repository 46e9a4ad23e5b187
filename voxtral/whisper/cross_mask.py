"""Windows of different lengths decoded together: each row of the batch reads only its own frames.

Each window is encoded at its own padded length, so its hypothesis does not depend on the
other sessions' windows that share its step; the shorter rows' encoder states are then
padded to the longest. transformers' Whisper decoder gives its cross-attention no mask,
so a pre-hook on each layer's cross-attention supplies one while such a batch decodes.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def pad_states(states: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """(batch, longest, width) from rows of (frames, width), and each row's frames."""
    lengths = [s.shape[0] for s in states]
    return nn.utils.rnn.pad_sequence(states, batch_first=True), lengths


class CrossAttentionMask:
    def __init__(self, decoder: nn.Module) -> None:
        # (batch, 1, 1, frames), added to the scores: 0 on a row's frames, the dtype's
        # lowest on its padding. None while every row reads all frames.
        self.mask: torch.Tensor | None = None
        for layer in decoder.layers:
            layer.encoder_attn.register_forward_pre_hook(self._supply, with_kwargs=True)

    def _supply(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if self.mask is None:
            return None
        return args, {**kwargs, "attention_mask": self.mask}

    @contextmanager
    def reading(self, states: torch.Tensor, lengths: list[int] | None) -> Iterator[None]:
        """While inside, row i of a decoder call on `states` reads only its first `lengths[i]`
        (None: all of them)."""
        frames = states.shape[1]
        if lengths is None or all(n == frames for n in lengths):
            yield
            return
        device = states.device
        padding = torch.arange(frames, device=device) >= torch.tensor(lengths, device=device)[:, None]
        mask = torch.zeros(padding.shape, dtype=states.dtype, device=device)
        self.mask = mask.masked_fill(padding, torch.finfo(states.dtype).min)[:, None, None, :]
        try:
            yield
        finally:
            self.mask = None
