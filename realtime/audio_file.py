"""An uploaded recording as the model's audio: decoded by libsndfile (WAV, FLAC, Ogg Vorbis and
Opus, MP3, AIFF and the rest it reads), mixed to mono, resampled to 16 kHz by soxr."""

import io

import numpy as np
import soundfile
import soxr

from voxtral.audio import SAMPLE_RATE

READ_FRAMES = 1 << 16  # decoded a block at a time: a long file's float64 copy never exists whole


class AudioFileError(ValueError):
    """The upload is no recording libsndfile can read."""


def decode(data: bytes) -> np.ndarray:
    """16 kHz mono float32 samples of an encoded recording."""
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as recording:
            rate = recording.samplerate
            resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
            blocks = []
            while len(block := recording.read(READ_FRAMES, dtype="float32", always_2d=True)):
                blocks.append(resampler.resample_chunk(block.mean(axis=1)))
            blocks.append(resampler.resample_chunk(np.zeros(0, np.float32), last=True))
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioFileError(
            "the file is no recording this server reads (WAV, FLAC, Ogg, MP3 and what libsndfile"
            f" reads; MP4/M4A and WebM are not): {getattr(exc, 'error_string', exc)}"
        ) from exc
    samples = np.concatenate(blocks)
    if not len(samples):
        raise AudioFileError("the file holds no audio")
    return samples
