"""Hindsight in the offline reference: each word as the served model hears it a fixed time after it.

Prints one JSON line. Streamed text is scored against the same model's offline decode of the
whole recording, which hears every word with all the audio after it: a word the model gets
right only from what is said later (the Endgame reader's "heartily" is "hotly" until a second
"heartily" is heard, seconds on) is one that a policy committing words a second after they
are spoken cannot get right. For each word of the real-speech passages (`--speech
synthetic`: the synthetic ones) and each lag L (`--lags`), the served model decodes offline
the audio from the start of the word's piece (the passage cut at quiet points into pieces of
at most 28 s, as its words were timed) to the word's end plus L, and the word is what that
decode says in its place (aligned on the passage's own timed words). The words so decided,
joined, are the text at lag L; its WER against the reference says what the model knows of a
word L after it. It is not a bound on streaming (a stream has the text before as its prompt,
and its own windows), and the alignment can misplace a word at a piece's edge. Decodes are
cached on a grid of `--grid` seconds (each word's time rounded up to it).
"""

import argparse
import difflib
import json
import math

import torch

from benchmarks.real_speech import pieces
from benchmarks.speech import Passage, tiny_en_models
from benchmarks.text import mean_wer, normalize_words, whisper_wer
from benchmarks.whisper_streaming import offline_texts, speech_passages
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.model import WhisperModel

MAX_WINDOW_SECONDS = 29.5  # a word near the end of its piece is decided within one window


def said_in_place(passage: Passage, first: int, last: int, heard: list[str], index: int) -> list[str]:
    """The words of `heard` (a decode of the audio from before the passage's word `first` to
    just after its word `last`) in the place of the passage's word `index`."""
    said = [normalize_words(w) for w in passage.words[first : last + 1]]
    flat = [w for words in said for w in words]
    owner = [i for i, words in zip(range(first, last + 1), said, strict=True) for _ in words]
    matcher = difflib.SequenceMatcher(None, flat, heard, autojunk=False)
    out: list[str] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        mine = [k for k in range(i1, i2) if owner[k] == index]
        if op == "equal":
            out += [heard[j1 + k - i1] for k in mine]
        elif op == "replace" and owner[i1] == index:
            out += heard[j1:j2]  # a replaced span's words go to the first word it replaces
        elif op == "insert" and 0 < i1 < len(flat) and owner[i1 - 1] == index:
            out += heard[j1:j2]  # words heard between two are the first one's (not past the last)
    return out


def text_at_lag(model: WhisperModel, passage: Passage, lag: float, grid: float, cache: dict) -> str:
    """Each word as the model decodes it from the start of its piece (`pieces`: at most 28 s,
    cut at quiet points) to `lag` after its end."""
    starts = [start / SAMPLE_RATE for start, _ in pieces(passage.audio)]
    seconds = len(passage.audio) / SAMPLE_RATE
    words: list[str] = []
    for index, end in enumerate(passage.word_ends):
        start = max(s for s in starts if s < end)
        at = min(seconds, start + MAX_WINDOW_SECONDS, math.ceil((end + lag) / grid) * grid)
        if (start, at) not in cache:
            audio = passage.audio[int(start * SAMPLE_RATE) : int(at * SAMPLE_RATE)]
            cache[start, at] = normalize_words(offline_texts(model, [audio])[0])
        first = min(i for i, e in enumerate(passage.word_ends) if e > start)
        last = max(i for i, e in enumerate(passage.word_ends) if e <= at)
        words += said_in_place(passage, first, last, cache[start, at], index)
    return " ".join(words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lags", default="0.6,1.0,1.6,3.0")
    parser.add_argument("--passages", type=int, default=2, help="each holds all three recordings")
    parser.add_argument("--grid", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--speech", choices=("real", "synthetic"), default="real")
    parser.add_argument("--float32", action="store_true", help="the model unquantized (served: int8)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    served, timing = tiny_en_models()
    model = timing if args.float32 else served
    passages = speech_passages(args.speech, model, timing, args.passages)
    references = [p.text for p in passages]
    caches: list[dict] = [{} for _ in passages]
    by_lag = {}
    for lag in (float(x) for x in args.lags.split(",")):
        texts = [text_at_lag(model, p, lag, args.grid, c) for p, c in zip(passages, caches, strict=True)]
        by_lag[f"{lag:g}"] = mean_wer(whisper_wer, references, texts)
    offline = mean_wer(whisper_wer, references, offline_texts(model, [p.audio for p in passages]))
    words = sum(len(p.words) for p in passages)
    served = "float32" if args.float32 else "int8"
    print(json.dumps({"model": f"whisper-tiny.en {served}", "speech": args.speech, "passages": len(passages),
                      "words": words, "offline_wer": offline, "wer_by_lag": by_lag}))  # fmt: skip


if __name__ == "__main__":
    main()
