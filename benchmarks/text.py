"""Word and character error rates on normalized text.

`word_error_rate` ignores case and punctuation only. `whisper_wer` scores English as Whisper's
own evaluations do (transformers' `EnglishTextNormalizer`: numbers as digits, "mr" for
"mister", fillers dropped), so "ten" and "10", which tiny.en writes either way from one decode
to the next, are one word. It leaves out the British-to-American spellings, which the normalizer
reads from a file the embedded models do not ship.
"""

import re
from collections.abc import Callable

from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

_WHISPER_ENGLISH = EnglishTextNormalizer({})


def normalize_words(text: str) -> list[str]:
    return re.sub(r"[^\w']+", " ", text.lower()).split()


def _edits(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def _rate(ref: list[str], hyp: list[str]) -> float:
    return _edits(ref, hyp) / max(1, len(ref))


def word_error_rate(reference: str, hypothesis: str) -> float:
    return _rate(normalize_words(reference), normalize_words(hypothesis))


def whisper_wer(reference: str, hypothesis: str) -> float:
    return _rate(_WHISPER_ENGLISH(reference).split(), _WHISPER_ENGLISH(hypothesis).split())


def mean_wer(score: Callable[[str, str], float], references: list[str], texts: list[str]) -> float:
    """The mean over texts of each one's error rate against its reference, as benchmarks print it."""
    return round(sum(score(r, t) for r, t in zip(references, texts, strict=True)) / len(texts), 4)


def char_error_rate(reference: str, hypothesis: str) -> float:
    """For languages written without spaces, where a word is not what `split` gives."""
    return _rate(list("".join(normalize_words(reference))), list("".join(normalize_words(hypothesis))))


def pooled_wer(references: list[str], texts: list[str]) -> float:
    """A set's word errors over its words, as Whisper's evaluations score English: a long
    conversation weighs more than a short one."""
    refs = [_WHISPER_ENGLISH(r).split() for r in references]
    errors = sum(_edits(r, _WHISPER_ENGLISH(t).split()) for r, t in zip(refs, texts, strict=True))
    return round(errors / max(1, sum(len(r) for r in refs)), 4)
