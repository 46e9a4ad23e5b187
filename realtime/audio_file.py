"""An uploaded recording as the model's audio, decoded as it is fed: libsndfile reads it (WAV,
FLAC, Ogg Vorbis and Opus, MP3, AIFF and the rest it reads), it is mixed to mono and resampled to
16 kHz by soxr. Compressed audio can decode to far more than its bytes (silence in FLAC costs
next to nothing), so no more than a block of it is ever held decoded."""

import io

import numpy as np
import soundfile
import soxr

from voxtral.audio import SAMPLE_RATE

BLOCK_SECONDS = 1.0  # at most this much of the recording decoded at a time
READ_SAMPLES = 1 << 16  # and at most this many samples, all channels together
# A rate carries sounds up to half itself, and speech reaches past 2 kHz: below this no speech
# is left. Resampled so far up, soxr also gives its samples in bursts of many seconds.
MIN_RATE = 4000


class AudioFileError(ValueError):
    """The upload is no recording libsndfile can read."""


def _unreadable(exc: Exception) -> AudioFileError:
    return AudioFileError(
        "the file is no recording this server reads (WAV, FLAC, Ogg, MP3 and what libsndfile"
        f" reads; MP4/M4A and WebM are not): {getattr(exc, 'error_string', exc)}"
    )


class Recording:
    """One upload's audio at 16 kHz, read a block at a time by one thread at a time."""

    def __init__(self, data: bytes) -> None:
        try:
            self.file = soundfile.SoundFile(io.BytesIO(data))
        except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
            raise _unreadable(exc) from exc
        rate, channels = self.file.samplerate, self.file.channels
        if self.file.frames <= 0:
            raise AudioFileError("the file holds no audio")
        if rate < MIN_RATE:
            raise AudioFileError(f"the recording is sampled at {rate} Hz; speech needs {MIN_RATE} at least")
        self.seconds = self.file.frames / rate  # as its header says
        # Frames per read bounded in time as well as in samples: resampled to 16 kHz, a read
        # at a low rate comes out several times its frames.
        self.frames_per_read = max(1, min(round(rate * BLOCK_SECONDS), READ_SAMPLES // channels))
        self.resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
        self.ended = False
        self.frames_read = 0

    def read(self) -> np.ndarray:
        """The next block; empty once the recording is over."""
        while not self.ended:
            try:
                block = self.file.read(self.frames_per_read, dtype="float32", always_2d=True)
            except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
                raise _unreadable(exc) from exc
            self.ended = not len(block)
            samples = self.resampler.resample_chunk(self._samples(block), last=self.ended)
            if len(samples):
                return samples
        return np.zeros(0, np.float32)

    def _samples(self, block: np.ndarray) -> np.ndarray:
        """A block (frames, channels) read from a float file as the wires' 16-bit samples would
        carry it: a value that is no number fails the upload (every window holding it would be
        heard as no number, and its text as nothing), and one past full scale is clipped there
        (far past it, a spectrum's powers overflow float32)."""
        if not np.isfinite(block).all():
            at = (self.frames_read + np.argwhere(~np.isfinite(block))[0, 0]) / self.file.samplerate
            raise AudioFileError(
                f"the recording holds a sample that is no number (NaN, infinity) {at:.2f} s in"
            )
        self.frames_read += len(block)
        return np.clip(block, -1.0, 1.0).mean(axis=1)
