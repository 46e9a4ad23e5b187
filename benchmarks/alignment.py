"""Word times from the model itself: Whisper's cross-attention alignment of a known text.

The text's tokens are forced through the decoder on the audio in one pass and aligned to
its frames by dynamic time warping, each word then moved off the silence at its edges
(`voxtral/whisper/timing.py`: what the server times its words with, here on a whole
recording's piece of known text rather than a streamed window).
"""

import itertools

import numpy as np

from voxtral.audio import HOP, normalize_log_mel, raw_log_mel
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.timing import align


def word_times(model: WhisperModel, samples: np.ndarray, words: list[str]) -> list[tuple[float, float]]:
    """Where each of `words` starts and ends in `samples` (at most 30 s), in seconds."""
    padded = np.concatenate([samples, np.zeros(-len(samples) % HOP, np.float32)])
    raw = raw_log_mel(padded, np.zeros(0, np.float32), np.zeros(0, np.float32), model.n_mels)
    states = model.encode(normalize_log_mel(raw, model.max_frames)[None])[0]
    word_tokens = [model.tokenizer.encode(" " + w, add_special_tokens=False).ids for w in words]
    bounds = np.cumsum([0, *(len(t) for t in word_tokens)])
    spans = [(int(a), int(b) - 1) for a, b in itertools.pairwise(bounds)]
    text = [t for tokens in word_tokens for t in tokens]
    return align(model, states, raw, model.prompt("en"), text, spans)


def word_ends(model: WhisperModel, samples: np.ndarray, words: list[str]) -> list[float]:
    """Where each of `words` ends in `samples` (at most 30 s), in seconds."""
    return [end for _, end in word_times(model, samples, words)]
