"""The wire's audio, torch-free: files to float32 mono 16 kHz, float32 to PCM16."""

from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16_000


class UnreadableAudio(ValueError):
    """A file that is no recording soundfile reads, or one holding a sample that is no number
    (as PCM16 it would be any value at all): the message says which, and where."""


def load_audio_file(path: str | Path, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Any file soundfile reads, as float32 mono at `rate`."""
    try:
        samples, file_rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (OSError, sf.LibsndfileError, RuntimeError, ValueError) as exc:
        raise UnreadableAudio(f"cannot read {path}: {exc}") from exc
    if not np.isfinite(samples).all():
        at = np.argwhere(~np.isfinite(samples))[0, 0] / file_rate
        raise UnreadableAudio(f"cannot read {path}: a sample that is no number (NaN, infinity) {at:.2f} s in")
    mono = samples.mean(axis=1)
    if file_rate != rate:
        mono = soxr.resample(mono, file_rate, rate)
    return np.ascontiguousarray(mono, dtype=np.float32)


def distinct_audio(samples: np.ndarray, seed: int | tuple[int, ...]) -> np.ndarray:
    """`samples` with a faint noise (-54 dBFS) of `seed`'s own: it hashes and encodes apart
    from every other seed's, as different speakers' audio does (identical audio would share
    the server's caches and flatter a measurement)."""
    return samples + np.random.default_rng(seed).normal(0, 0.002, len(samples)).astype(np.float32)


def float32_to_pcm16(samples: np.ndarray) -> bytes:
    """Rounded to the nearest step and clipped to PCM16's range, little-endian."""
    return np.round(np.clip(samples, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()
