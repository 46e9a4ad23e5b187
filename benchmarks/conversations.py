"""Conversations with known turns, for speaker labels: real readers (or synthetic voices)
taking turns of 1-15 s, a short pause between turns, and the truth of who spoke when.

Real voices are those of `benchmarks/real_speech.py`'s recordings that hold one reader each
(`two_cities`, `beckett`) and moonshine-voice's `clone-test.wav` (a third reader, 4 s).
Each turn is a piece of its reader's recording cut at its quietest points; a short recording
is read again in later turns. Synthetic voices are espeak-ng's and flite's.
"""

from dataclasses import dataclass
from importlib.metadata import distribution
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from benchmarks.real_speech import recording
from benchmarks.speech import SENTENCES, synthesize
from clients.audio import SAMPLE_RATE, load_audio_file
from voxtral.runner import TimedWord

SYNTHETIC_VOICES = [("espeak-ng", "en-us"), ("flite", "slt"), ("flite", "awb")]


@dataclass(frozen=True)
class Turn:
    speaker: int
    start: float  # seconds into the conversation
    end: float


@dataclass(frozen=True)
class Conversation:
    name: str
    audio: np.ndarray
    turns: list[Turn]

    def speaker_at(self, seconds: float) -> int:
        """Who spoke at `seconds`, or, in a pause, in the nearest turn."""
        return min(self.turns, key=lambda t: max(t.start - seconds, seconds - t.end, 0)).speaker


def _voiced(audio: np.ndarray) -> np.ndarray:
    """`audio` without its leading and trailing quiet."""
    loud = np.flatnonzero(np.abs(audio) > 0.02 * np.abs(audio).max())
    return audio[loud[0] : loud[-1] + 1]


def cuts(
    audio: np.ndarray, lengths: list[float], frame: int, near: tuple[int, int], restart: int
) -> list[tuple[int, int]]:
    """(start, stop) samples of pieces of about `lengths` seconds each, read from `audio` on and
    on (from its start again once less than `restart` samples are left), each cut at its
    quietest `frame` samples near the wanted length: from `near` of it (a fraction, numerator
    and denominator) to as far past it (near = (3, 4): from 3/4 to 5/4 of the length)."""
    out, at = [], 0
    for length in lengths:
        if len(audio) - at < restart:
            at = 0
        want = min(int(length * SAMPLE_RATE), len(audio) - at)
        lo, hi = (
            at + want * near[0] // near[1],
            min(len(audio), at + want * (2 * near[1] - near[0]) // near[1]),
        )
        frames = audio[lo : lo + (hi - lo) // frame * frame].reshape(-1, frame)
        cut = lo + int(np.argmin(np.square(frames).mean(axis=1))) * frame + frame // 2 if len(frames) else hi
        out.append((at, cut))
        at = cut
    return out


def _pieces(audio: np.ndarray, lengths: list[float]) -> list[np.ndarray]:
    """Pieces of about `lengths` seconds each, each cut at the quietest 0.1 s within a quarter of
    its length of its end, without their leading and trailing quiet."""
    return [_voiced(audio[a:b]) for a, b in cuts(audio, lengths, SAMPLE_RATE // 10, (3, 4), SAMPLE_RATE)]


def real_voices() -> list[np.ndarray]:
    clone = distribution("moonshine-voice").locate_file("moonshine_voice/assets/clone-test.wav")
    return [recording("two_cities").audio, recording("beckett").audio, load_audio_file(clone)]


def synthetic_voices(tmp: Path) -> list[np.ndarray]:
    pause = np.zeros(SAMPLE_RATE * 3 // 10, np.float32)
    return [
        np.concatenate(
            [part for s in SENTENCES[i::3] for part in (synthesize(engine, voice, 175, s, tmp), pause)]
        )
        for i, (engine, voice) in enumerate(SYNTHETIC_VOICES)
    ]


def conversation(name: str, voices: list[np.ndarray], speakers: int, turns: int, seed: int) -> Conversation:
    """`turns` turns of 1-15 s among the first `speakers` voices, never the same twice in a
    row, with a pause of 0.3-1.0 s before each."""
    rng = np.random.default_rng(seed)
    order = [0]
    while len(order) < turns:
        order.append(int(rng.choice([s for s in range(speakers) if s != order[-1]])))
    lengths = {s: [float(rng.uniform(1, 15)) for t in order if t == s] for s in range(speakers)}
    pieces = {s: _pieces(voices[s], lengths[s]) for s in range(speakers)}
    parts, truth, at = [], [], 0.0
    for speaker in order:
        pause = float(rng.uniform(0.3, 1.0))
        piece = pieces[speaker].pop(0)
        parts += [np.zeros(int(pause * SAMPLE_RATE), np.float32), piece]
        at += pause
        truth.append(Turn(speaker, at, at + len(piece) / SAMPLE_RATE))
        at += len(piece) / SAMPLE_RATE
    parts.append(np.zeros(SAMPLE_RATE, np.float32))
    return Conversation(name, np.concatenate(parts), truth)


def label_mapping(pairs: list[tuple[str | None, int]]) -> dict[str, int]:
    """The labels' best one-to-one mapping onto true speakers: the most pairs agree."""
    labels = sorted({label for label, _ in pairs if label is not None})
    speakers = sorted({speaker for _, speaker in pairs})
    counts = np.zeros((len(labels), len(speakers)))
    for label, speaker in pairs:
        if label is not None:
            counts[labels.index(label), speakers.index(speaker)] += 1
    rows, cols = linear_sum_assignment(-counts)
    return {labels[r]: speakers[c] for r, c in zip(rows, cols, strict=True)}


def word_accuracy(conversation: Conversation, words: list[TimedWord]) -> float:
    """Words labelled with their true speaker, after the best mapping of labels to speakers."""
    pairs = [(w.speaker, conversation.speaker_at((w.start + w.end) / 2)) for w in words]
    mapping = label_mapping(pairs)
    return sum(mapping.get(label) == speaker for label, speaker in pairs) / max(1, len(pairs))
