"""G.711, the telephone's 8 kHz companded audio (ITU-T G.711): mu-law as North America and
Japan carry it, A-law as everywhere else does, one byte a sample, decoded to float32.

Each of the 256 codes stands for one 16-bit level, so a table read decodes a whole chunk.
"""

from functools import cache

import numpy as np

RATE = 8000  # G.711 is sampled at 8 kHz
_MU_BIAS = 0x84  # added before mu-law's segments: the curve passes through zero


@cache
def _mulaw_levels() -> np.ndarray:
    """The 16-bit level of each mu-law code: sent inverted, a sign bit, a 3-bit segment and
    a 4-bit step within the segment, each segment twice the last's steps."""
    code = ~np.arange(256) & 0xFF
    segment, step = (code >> 4) & 0x7, code & 0xF
    magnitude = (((step << 3) + _MU_BIAS) << segment) - _MU_BIAS
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.float32) / 32768.0


@cache
def _alaw_levels() -> np.ndarray:
    """The 16-bit level of each A-law code: sent with its even bits inverted, a sign bit
    (set: positive), a 3-bit segment and a 4-bit step; the first two segments are linear."""
    code = np.arange(256) ^ 0x55
    segment, step = (code >> 4) & 0x7, code & 0xF
    magnitude = np.where(segment == 0, (step << 4) + 8, ((step << 4) + 0x108) << np.maximum(segment - 1, 0))
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.float32) / 32768.0


def mulaw_to_float32(data: bytes) -> np.ndarray:
    return _mulaw_levels()[np.frombuffer(data, np.uint8)]


def alaw_to_float32(data: bytes) -> np.ndarray:
    return _alaw_levels()[np.frombuffer(data, np.uint8)]
