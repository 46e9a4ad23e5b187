"""Silero VAD for every utterance at once: one batched call per step, state per utterance.

The model (PyPI `silero-vad`, which ships it) reads 32 ms frames of 512 samples, each
with the 64 samples before it, and carries a recurrent state from frame to frame. Its
packaged wrapper keeps one state for one fixed batch; utterances come and go and have
different amounts of new audio, so the inner 16 kHz network's parts are called directly.
Its spectrum and convolutions see one frame and nothing before it: every frame of every
utterance goes through them in one call. Its recurrent cell runs as one LSTM layer over each
utterance's frames in turn, from the utterance's own state, gathered into the batch and
scattered back: no call per frame.
"""

from dataclasses import dataclass, field

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

from voxtral.audio import SAMPLE_RATE
from voxtral.turn_model import CLIP_SAMPLES

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
    # A semantic end of turn: a pause of `silence_ms` ends the turn only where the turn model
    # (`voxtral/turn_model.py`) hears it complete with at least this probability; a pause it
    # hears as mid-sentence ends the turn once it has lasted `max_silence_ms`. None: silence alone.
    complete_at: float | None = None
    max_silence_ms: int = 0


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
    # Semantic turn ends only: the audio the VAD last read (the turn model's clip), and whether
    # the current pause awaits the model's judgement or has had it.
    recent: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    awaiting: bool = False
    judged: bool = False

    def feed(self, samples: np.ndarray) -> None:
        self.unread = np.concatenate([self.unread, samples])

    def whole_frames(self) -> int:
        return len(self.unread) // FRAME

    def frames(self, n: int) -> np.ndarray:
        """(n, CONTEXT + FRAME): its first `n` unread frames, each after the samples before it."""
        heard = np.concatenate([self.context, self.unread[: n * FRAME]])
        return sliding_window_view(heard, CONTEXT + FRAME)[::FRAME]

    def paused_clip(self) -> np.ndarray:
        """The turn's audio up to where its pause awaiting judgement began, at most the turn
        model's clip (with the pause left out, the model tells a sentence cut short from one
        ended more surely)."""
        end = len(self.recent) - (self.frames_read - self.silence_from) * FRAME
        return self.recent[max(0, end - CLIP_SAMPLES) : end]

    def judge(self, complete: float) -> "Turn | None":
        """The turn model's probability that the paused turn is complete: a turn that ends
        there, or a pause that now waits for `max_silence_ms`."""
        self.awaiting, self.judged = False, True
        if complete < self.config.complete_at or not self.speaking or self.silence_from is None:
            return None
        self.speaking, start, self.silence_from = False, self.silence_from, None
        return Turn(False, start * FRAME_MS)

    def pause_ms(self) -> int | None:
        """While a turn goes on: where the silence heard now began (ms), too short yet to end it."""
        return self.silence_from * FRAME_MS if self.speaking and self.silence_from is not None else None

    def end_turn(self, audio_ms: int) -> Turn | None:
        """The input ended at `audio_ms`: a turn still going on ends there."""
        if not self.speaking:
            return None
        self.speaking, self.silence_from, self.awaiting = False, None, False
        return Turn(False, audio_ms)


class Vad:
    def __init__(self) -> None:
        self.network = load_silero_vad()._model  # the 16 kHz network, without the one-state wrapper
        # Its recurrent cell, as a layer that steps through every stream's frames in one call.
        cell = self.network.decoder.rnn
        self.rnn = torch.nn.LSTM(cell.weight_ih.shape[1], cell.weight_hh.shape[1], batch_first=True)
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(self.rnn, f"{name}_l0").data.copy_(getattr(cell, name))
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
        heard = [i for i, n in enumerate(counts) if n]
        if not heard:
            return [np.zeros(0, np.float32) for _ in streams]
        self.calls += 1
        lengths = [counts[i] for i in heard]
        frames = np.concatenate([streams[i].frames(n) for i, n in zip(heard, lengths, strict=True)])
        net = self.network
        features = net.encoder(net.stft(torch.from_numpy(frames)))[:, :, 0]
        sequences = pack_sequence(list(torch.split(features, lengths)), enforce_sorted=False)
        state = torch.cat([streams[i].state for i in heard], dim=1)  # (2, streams heard, width)
        steps, (h, c) = self.rnn(sequences, (state[0:1], state[1:2]))
        padded, _ = pad_packed_sequence(steps, batch_first=True)
        hidden = padded[torch.arange(padded.shape[1]) < torch.tensor(lengths)[:, None]]  # frames' order
        probs = net.decoder.decoder(hidden[:, :, None])[:, 0].mean(dim=-1).numpy()
        out, states = [np.zeros(0, np.float32) for _ in streams], torch.cat([h, c])
        split = np.split(probs, np.cumsum(lengths)[:-1])
        for j, (i, n, stream_probs) in enumerate(zip(heard, lengths, split, strict=True)):
            stream = streams[i]
            stream.context = stream.unread[n * FRAME - CONTEXT : n * FRAME].copy()
            if stream.config.complete_at is not None:  # the turn model's clip ends in these frames
                stream.recent = np.concatenate([stream.recent[-CLIP_SAMPLES:], stream.unread[: n * FRAME]])
            stream.unread, stream.state = stream.unread[n * FRAME :], states[:, j : j + 1]
            out[i] = stream_probs
        return out

    def _track(self, s: VadStream, prob: float) -> Turn | None:
        """Silero's own hysteresis (its `VADIterator`), plus a minimum length for speech to start."""
        c, frame = s.config, s.frames_read
        if not s.speaking:
            s.speech_run = s.speech_run + 1 if prob >= c.threshold else 0
            if s.speech_run * FRAME_MS < c.min_speech_ms:
                return None
            start = frame + 1 - s.speech_run
            s.speaking, s.speech_run, s.judged = True, 0, False
            return Turn(True, start * FRAME_MS)
        if prob >= c.threshold:
            s.silence_from, s.awaiting, s.judged = None, False, False
        elif prob < c.threshold - 0.15 and s.silence_from is None:
            s.silence_from = frame
        if s.silence_from is None or (silent := (frame + 1 - s.silence_from) * FRAME_MS) < c.silence_ms:
            return None
        if c.complete_at is not None and silent < c.max_silence_ms:
            s.awaiting = not s.judged  # the turn model judges this pause, once
            return None
        s.speaking, start = False, s.silence_from
        s.silence_from, s.awaiting = None, False
        return Turn(False, start * FRAME_MS)
