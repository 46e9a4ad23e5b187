"""bfloat16 for the layers that read a whole window, on CPUs that multiply it in hardware.

A CPU with AMX tiles (Intel's since Sapphire Rapids) multiplies bfloat16 matrices in its tile
unit, through oneDNN, faster than its vector units multiply float32 or int8: Whisper's
encoder, a window of hundreds of rows, runs faster in bfloat16 there than with int8 weights,
and its states come nearer float32's (a bfloat16 product rounds nothing but its inputs'
mantissas; a dynamic int8 one rounds each input to one of 256 steps). So do the decoder's
cross-attention keys and values, made from a window's states and read whole by every token's
pass. Without the tiles bfloat16 is emulated, slower than float32. A token's linear layers,
a few rows, are slower in bfloat16 than with float16 weights (`half_weights.py`), so the
decoder keeps those.
"""

import torch


def available() -> bool:
    """Whether this CPU has AMX tiles, as torch's CPU probe reports them."""
    return torch.cpu._is_amx_tile_supported()
