"""Word and character error rates on normalized text (case and punctuation ignored)."""

import re


def normalize_words(text: str) -> list[str]:
    return re.sub(r"[^\w']+", " ", text.lower()).split()


def _edits(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref = normalize_words(reference)
    return _edits(ref, normalize_words(hypothesis)) / max(1, len(ref))


def char_error_rate(reference: str, hypothesis: str) -> float:
    """For languages written without spaces, where a word is not what `split` gives."""
    ref = list("".join(normalize_words(reference)))
    return _edits(ref, list("".join(normalize_words(hypothesis)))) / max(1, len(ref))
