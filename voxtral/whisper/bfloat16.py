"""bfloat16 for the layers that read a whole window, on CPUs that multiply it in hardware.

A CPU with AMX tiles (Intel's since Sapphire Rapids) multiplies bfloat16 matrices in its tile
unit, through oneDNN, faster than its vector units multiply float32 or int8: Whisper's
encoder, a window of hundreds of rows, runs faster in bfloat16 there than with int8 weights,
and its states come nearer float32's (a bfloat16 product rounds nothing but its inputs'
mantissas; a dynamic int8 one rounds each input to one of 256 steps). Without the tiles
bfloat16 is emulated, slower than float32. A token's pass, a few rows, is slower in bfloat16
than with float16 weights (`half_weights.py`), so the decoder keeps those.
"""

import torch
from torch import nn


def available() -> bool:
    """Whether this CPU has AMX tiles, as torch's CPU probe reports them."""
    return torch.cpu._is_amx_tile_supported()


class BFloat16Linear(nn.Module):
    """`linear` in bfloat16 between float32 layers: its input rounded to bfloat16, its output
    returned as float32."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().bfloat16(), requires_grad=False)
        self.bias = (
            None
            if linear.bias is None
            else nn.Parameter(linear.bias.detach().bfloat16(), requires_grad=False)
        )
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.bfloat16(), self.weight, self.bias).to(x.dtype)
