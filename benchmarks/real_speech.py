"""Recordings of real people reading, for benchmarks and tests: the clips `moonshine-voice`
ships in its wheel (`moonshine_voice/assets/`, MIT licence, installed with voxrt[test]).
The files are read where pip put them; the package itself is never imported.

- `two_cities.wav`: 44 s, one reader, the opening paragraph of Charles Dickens' *A Tale of
  Two Cities* (1859, public domain): its reference text is the book's (`TWO_CITIES`).
- `endgame_nagg_nell.wav`: 28 s, two voices in dialogue (from Samuel Beckett's *Endgame*).
- `beckett.wav`: 10 s, one voice.
Where no reference text is kept, a streamed transcript is scored against the same model's
offline transcript of the same audio: that gap is the streaming penalty.
"""

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution

import numpy as np

from clients.audio import load_audio_file

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
