"""Rotary angles exact at any position, so that hour 8 of a session decodes as hour 1 does.

Attention inside a sliding window depends only on position differences, but each angle
is computed from an absolute position, and a long session's positions are large (12.5 text
and 50 encoder positions a second). transformers multiplies position by frequency in
float32: hours in, the product is rounded to a sizeable fraction of a radian in the
fastest-turning pairs, noise the model never saw (`benchmarks/voxtral_positions.py`).
In float64 the angle is good to a billionth of a radian for any session's length, and
cos and sin are then rounded to the model's dtype as they are at position 0.
"""

import torch

from voxtral.errors import WeightsError


class ExactRotary(torch.nn.Module):
    """Replaces a stack's `rotary_emb`: the same frequencies and scaling, angles in float64."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        # Other rope types rescale their frequencies with the context's length: not Voxtral's.
        kind = getattr(inner, "rope_type", None)
        if kind != "default":
            raise WeightsError(f"rotary embedding of type {kind!r}: only 'default' is supported")
        self.inv_freq = torch.nn.Buffer(inner.inv_freq.double(), persistent=False)
        self.scaling = inner.attention_scaling

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].double() * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return (angles.cos() * self.scaling).to(x.dtype), (angles.sin() * self.scaling).to(x.dtype)
