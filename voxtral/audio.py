"""Audio in: PCM16 or G.711 bytes to float32 mono, and Whisper-style log-mel features."""

from functools import cache
from typing import Literal

import librosa
import numpy as np
import torch

from voxtral.g711 import alaw_to_float32, mulaw_to_float32

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160


def pcm16_to_float32(data: bytes) -> np.ndarray:
    """Little-endian PCM16 mono to float32 in [-1, 1): one vectorized op, no Python loop."""
    if len(data) % 2:
        raise ValueError(f"PCM16 audio needs an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


Encoding = Literal["pcm16", "mulaw", "alaw"]  # how a wire's audio bytes are coded
_DECODERS = {"pcm16": pcm16_to_float32, "mulaw": mulaw_to_float32, "alaw": alaw_to_float32}


def decode(encoding: Encoding, data: bytes) -> np.ndarray:
    """Audio bytes as float32 samples; ValueError for bytes no whole sample's."""
    return _DECODERS[encoding](data)


@cache
def _mel_filters(n_mels: int) -> np.ndarray:
    return librosa.filters.mel(sr=SAMPLE_RATE, n_fft=N_FFT, n_mels=n_mels, dtype=np.float64)


@cache
def _window() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1]  # periodic, as torch.hann_window


LEFT_CONTEXT = N_FFT // 2  # samples before a chunk that its first frame sees
RIGHT_CONTEXT = N_FFT // 2 - HOP  # samples past a chunk that its last frame sees


def raw_log_mel(
    samples: np.ndarray, left_context: np.ndarray, right_context: np.ndarray, n_mels: int = 80
) -> torch.Tensor:
    """log10 mel power of `samples`, one frame per 160 samples, shape (n_mels, len // 160).

    Frame t is centred on sample 160 * t, as in Whisper's centred STFT. With the 200
    samples before the chunk and the `RIGHT_CONTEXT` samples after it (zeros where the
    stream has none), consecutive chunks give exactly the frames of the whole signal.
    Whisper's dynamic-range clamp needs the whole window: see `normalize_log_mel`.

    Computed in float64 and rounded once, so any chunking gives bit-identical frames: in
    float32 the mel product's blocking depends on the chunk's length and moves ~0.5 % of
    values by one last bit, which a bfloat16 model can round into a different token.

    numpy, not torch: this runs on the engine thread, and a torch FFT or matmul there
    would start a second OpenMP thread team next to the device worker's, which on a
    small machine throttles both (libgomp stops spinning when oversubscribed).
    """
    if len(samples) % HOP:
        raise ValueError(f"chunk of {len(samples)} samples is not a multiple of {HOP}")
    half = N_FFT // 2
    left = left_context[-LEFT_CONTEXT:]
    right = right_context[:RIGHT_CONTEXT]
    padded = np.concatenate(
        [
            np.zeros(half - len(left), np.float32),
            left,
            samples,
            right,
            np.zeros(half - len(right), np.float32),
        ]
    )
    mel = np.maximum(mel_power(padded, len(samples) // HOP, n_mels), 1e-10)
    return torch.from_numpy(np.log10(mel).astype(np.float32))


def mel_power(padded: np.ndarray, num_frames: int, n_mels: int) -> np.ndarray:
    """Mel power (n_mels, num_frames) in float64 of frames of 400 samples every 160, the first
    starting at `padded[0]` (librosa's with centring and padding left to the caller)."""
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:num_frames]
    spectrum = np.fft.rfft(frames * _window(), axis=-1)
    power = spectrum.real**2 + spectrum.imag**2
    return _mel_filters(n_mels) @ power.T


def normalize_log_mel(raw: torch.Tensor, num_frames: int) -> torch.Tensor:
    """Whisper's scaling over a window, right-padded to `num_frames` with the padding value."""
    floor = raw.max() - 8.0
    out = torch.full((raw.shape[0], num_frames), float(floor), dtype=raw.dtype)
    out[:, : raw.shape[1]] = torch.maximum(raw, floor)
    return (out + 4.0) / 4.0
