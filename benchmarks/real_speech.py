"""Recordings of real people reading, for benchmarks and tests: the clips `moonshine-voice`
ships in its wheel (`moonshine_voice/assets/`, MIT licence, installed with voxrt[test]).
The files are read where pip put them; the package itself is never imported.

- `two_cities.wav`: 44 s, one reader, the opening paragraph of Charles Dickens' *A Tale of
  Two Cities* (1859, public domain): its reference text is the book's (`TWO_CITIES`).
- `endgame_nagg_nell.wav`: 28 s, two voices in dialogue (from Samuel Beckett's *Endgame*).
- `beckett.wav`: 10 s, one voice.
Where no reference text is kept, a streamed transcript is scored against the same model's
offline transcript of the same audio: that gap is the streaming penalty.

`real_passages` builds a benchmark's sessions from them: each session reads all three, in
its own order, after its own pause, with a faint noise of its own (identical audio would
share caches and flatter).
"""

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution

import numpy as np

from benchmarks.alignment import word_ends
from benchmarks.speech import Passage
from clients.audio import SAMPLE_RATE, distinct_audio, load_audio_file
from voxtral.whisper.model import WhisperModel

TWO_CITIES = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way, in short, the period was so far like the present period, that some of its "
    "noisiest authorities insisted on its being received, for good or for evil, in the superlative degree "
    "of comparison only."
)


@dataclass(frozen=True)
class Recording:
    name: str
    audio: np.ndarray  # 16 kHz mono float32
    reference: str | None  # the words read, where known


REFERENCES = {"two_cities": TWO_CITIES, "endgame_nagg_nell": None, "beckett": None}


def recording(name: str) -> Recording:
    """One of `REFERENCES`' recordings, from the installed `moonshine-voice` wheel."""
    try:
        path = distribution("moonshine-voice").locate_file(f"moonshine_voice/assets/{name}.wav")
    except PackageNotFoundError as exc:
        raise RuntimeError("real speech needs moonshine-voice: bash scripts/setup.sh installs it") from exc
    return Recording(name, load_audio_file(path), REFERENCES[name])


PAUSE_SECONDS = (0.4, 1.2)  # between recordings, drawn per session
MAX_PIECE_SECONDS = 28.0  # the alignment reads one Whisper window


def pieces(audio: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) samples of pieces of at most `MAX_PIECE_SECONDS`, cut at the quietest
    0.1 s of each piece's second half."""
    out, start, frame = [], 0, SAMPLE_RATE // 10
    while len(audio) - start > MAX_PIECE_SECONDS * SAMPLE_RATE:
        first = start + int(MAX_PIECE_SECONDS * SAMPLE_RATE) // 2
        frames = audio[first : start + int(MAX_PIECE_SECONDS * SAMPLE_RATE)]
        energy = np.square(frames[: len(frames) // frame * frame]).reshape(-1, frame).mean(axis=1)
        cut = first + int(np.argmin(energy)) * frame + frame // 2
        out.append((start, cut))
        start = cut
    return [*out, (start, len(audio))]


def timed_words(timing: WhisperModel, transcribe: Callable[[np.ndarray], str], audio: np.ndarray):
    """The words `transcribe` hears in `audio`, each with where it ends (seconds): word end
    times need words, and a recording without a reference has only the model's."""
    words: list[str] = []
    ends: list[float] = []
    for start, stop in pieces(audio):
        piece_words = transcribe(audio[start:stop]).split()
        words += piece_words
        ends += [start / SAMPLE_RATE + end for end in word_ends(timing, audio[start:stop], piece_words)]
    return words, ends


def real_passages(timing: WhisperModel, transcribe: Callable[[np.ndarray], str], count: int) -> list[Passage]:
    """`count` sessions' streams of the three recordings. Each recording's text is its
    reference where one is kept, else `transcribe`'s (the served model offline)."""
    recordings = [recording(name) for name in REFERENCES]
    timed = {r.name: timed_words(timing, transcribe, r.audio) for r in recordings}
    texts = {r.name: r.reference or transcribe(r.audio) for r in recordings}
    passages = []
    for index in range(count):
        rng = np.random.default_rng(index)
        order = np.roll(np.arange(len(recordings)), -index)
        audio_parts, words, ends, text = [], [], [], []
        offset = 0.0
        for i in order:
            r = recordings[i]
            pause = np.zeros(int(rng.uniform(*PAUSE_SECONDS) * SAMPLE_RATE), np.float32)
            offset += len(pause) / SAMPLE_RATE
            words += timed[r.name][0]
            ends += [offset + end for end in timed[r.name][1]]
            text.append(texts[r.name])
            audio_parts += [pause, r.audio]
            offset += len(r.audio) / SAMPLE_RATE
        audio = distinct_audio(np.concatenate(audio_parts), index)
        name = "+".join(recordings[i].name for i in order)
        passages.append(Passage(audio, words, ends, " ".join(text), name))
    return passages
