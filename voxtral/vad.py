"""Silero VAD for every utterance at once: one batched call per step, state per utterance.

The model (PyPI `silero-vad`, which ships it) reads 32 ms frames of 512 samples, each
with the 64 samples before it, and carries a recurrent state from frame to frame. Its
packaged wrapper keeps one state for one fixed batch; utterances come and go and have
different amounts of new audio, so the inner 16 kHz network is called directly with
each utterance's own state gathered into the batch and scattered back.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from voxtral.audio import SAMPLE_RATE

# Importing silero_vad sets torch's threads to 1 for the whole process: the model that
# shares the process would run on one core. Whoever set them keeps them.
_threads = torch.get_num_threads()
from silero_vad import load_silero_vad  # noqa: E402

torch.set_num_threads(_threads)

FRAME = 512
CONTEXT = 64
FRAME_MS = FRAME * 1000 // SAMPLE_RATE


@dataclass
class Turn:
    """Speech started (`speaking`) or stopped at `audio_ms` into the utterance's audio."""

    speaking: bool
    audio_ms: int


@dataclass
class VadConfig:
    threshold: float = 0.5  # speech starts at this probability (Silero's default)
    # and goes on until the probability stays below `threshold - 0.15` for `silence_ms`
    silence_ms: int = 500
    min_speech_ms: int = 96  # a blip shorter than this (3 frames) is not speech


@dataclass
class VadStream:
    """One utterance's VAD: its settings, the network's state, unread audio and the turn being
    tracked. The engine thread owns it (`Utterances.append` feeds it, `Vad` reads it)."""

    config: VadConfig = field(default_factory=VadConfig)
    state: torch.Tensor = field(default_factory=lambda: torch.zeros(2, 1, 128))
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, np.float32))
    unread: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    frames_read: int = 0
    speaking: bool = False
    speech_run: int = 0  # frames in a row at or above the threshold, while not speaking
    silence_from: int | None = None  # while speaking: the first frame of the current silence

    def feed(self, samples: np.ndarray) -> None:
        self.unread = np.concatenate([self.unread, samples])

    def whole_frames(self) -> int:
        return len(self.unread) // FRAME

    def end_turn(self, audio_ms: int) -> Turn | None:
        """The input ended at `audio_ms`: a turn still going on ends there."""
        if not self.speaking:
            return None
        self.speaking, self.silence_from = False, None
        return Turn(False, audio_ms)


class Vad:
    def __init__(self) -> None:
        self.network = load_silero_vad()._model  # the 16 kHz network, without the one-state wrapper
        self.calls = 0  # batched calls, one per step with audio to read

    def track(self, stream: VadStream, probabilities: np.ndarray) -> list[Turn]:
        """The turns `stream` saw in its frames of these probabilities, in order."""
        turns = []
        for prob in probabilities:
            if (turn := self._track(stream, float(prob))) is not None:
                turns.append(turn)
            stream.frames_read += 1
        return turns

    @torch.inference_mode()
    def probabilities(self, streams: list[VadStream]) -> list[np.ndarray]:
        """Speech probability of every whole frame the streams hold: all streams in one batched call.
        The streams move on only once every frame is read: a call that raised can run again."""
        counts = [s.whole_frames() for s in streams]
        out = [np.zeros(n, np.float32) for n in counts]
        if not any(counts):
            return out
        self.calls += 1
        states = [s.state for s in streams]
        contexts = [s.context for s in streams]
        for k in range(max(counts)):
            rows = [i for i, n in enumerate(counts) if n > k]
            frames = np.stack(
                [np.concatenate([contexts[i], streams[i].unread[k * FRAME :][:FRAME]]) for i in rows]
            )
            state = torch.cat([states[i] for i in rows], dim=1)
            probs, state = self.network(torch.from_numpy(frames), state)
            for j, i in enumerate(rows):
                states[i], contexts[i] = state[:, j : j + 1], frames[j, -CONTEXT:]
                out[i][k] = probs[j, 0]
        for stream, n, state, context in zip(streams, counts, states, contexts, strict=True):
            stream.unread, stream.state, stream.context = stream.unread[n * FRAME :], state, context
        return out

    def _track(self, s: VadStream, prob: float) -> Turn | None:
        """Silero's own hysteresis (its `VADIterator`), plus a minimum length for speech to start."""
        c, frame = s.config, s.frames_read
        if not s.speaking:
            s.speech_run = s.speech_run + 1 if prob >= c.threshold else 0
            if s.speech_run * FRAME_MS < c.min_speech_ms:
                return None
            start = frame + 1 - s.speech_run
            s.speaking, s.speech_run = True, 0
            return Turn(True, start * FRAME_MS)
        if prob >= c.threshold:
            s.silence_from = None
        elif prob < c.threshold - 0.15 and s.silence_from is None:
            s.silence_from = frame
        if s.silence_from is None or (frame + 1 - s.silence_from) * FRAME_MS < c.silence_ms:
            return None
        s.speaking, start = False, s.silence_from
        s.silence_from = None
        return Turn(False, start * FRAME_MS)
