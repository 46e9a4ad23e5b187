"""Words as the streaming policy counts them, in text and in tokens alike.

A word is what `str.split` gives, or, in languages written without spaces (Chinese,
Japanese, Thai...), one character. The policy commits whole words, so the same count must
come from a hypothesis's text and from its tokens (which of them were heard in time).
"""

from tokenizers import Tokenizer

from voxtral.runner import TokenLogprob
from voxtral.whisper.hypothesis import SECONDS_PER_TIMESTAMP, Hypothesis

# Whisper's languages written without spaces between words (its own word splitter's list).
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})


def is_spaced(language: str | None) -> bool:
    return language not in UNSPACED_LANGUAGES


def split_words(text: str, spaced: bool) -> list[str]:
    return text.split() if spaced else [c for c in text if not c.isspace()]


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE writes each byte as a printable character: printable Latin-1 bytes as
    themselves, the others as code points from 256 up, in byte order. Character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    alphabet = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    alphabet |= {chr(256 + n): b for n, b in enumerate(others)}
    return alphabet


_BYTE_OF = _byte_level_alphabet()


def token_logprob(piece: str, logprob: float) -> TokenLogprob:
    """A byte-level BPE token (`Tokenizer.id_to_token`) as text and bytes, with its log-probability."""
    data = bytes(_BYTE_OF.get(c, 0) for c in piece)
    return TokenLogprob(data.decode("utf-8", errors="replace"), logprob, tuple(data))


class TokenWords:
    def __init__(self, tokenizer: Tokenizer, timestamp_begin: int, spaced: bool) -> None:
        self.tokenizer, self.timestamp_begin, self.spaced = tokenizer, timestamp_begin, spaced
        self.joiner = " " if spaced else ""

    def _starts(self, token: int, after_timestamp: bool) -> tuple[int, bool]:
        """How many words begin in a text token, and whether it begins at a word's edge."""
        piece = self.tokenizer.id_to_token(token) or ""
        if self.spaced:
            begins = piece.startswith("Ġ") or after_timestamp
            return int(begins), begins
        data = [_BYTE_OF.get(c, 0) for c in piece]
        # A UTF-8 character starts at every byte that is not a continuation (10xxxxxx).
        count = sum(1 for b in data if b & 0xC0 != 0x80 and not chr(b).isspace())
        return count, not data or data[0] & 0xC0 != 0x80

    def word_starts(self, tokens: list[int]) -> list[tuple[int, bool]]:
        """Per token: how many words begin in it (timestamps: none), and if it begins at a word edge."""
        out, after_timestamp = [], True
        for token in tokens:
            if token >= self.timestamp_begin:
                out.append((0, True))
                after_timestamp = True
                continue
            out.append(self._starts(token, after_timestamp))
            after_timestamp = False
        return out

    def word_spans(self, text_tokens: list[int]) -> list[tuple[int, int]]:
        """Per word, the first and last of the text tokens (no timestamps) it is written in; a
        token holding several characters of an unspaced language is each one's."""
        spans: list[list[int]] = []
        for position, (count, at_edge) in enumerate(self.word_starts(text_tokens)):
            if spans and (count == 0 or not at_edge):
                spans[-1][1] = position  # the word before goes on in this token
            spans += [[position, position] for _ in range(count)]
        return [(first, last) for first, last in spans]

    def words_heard(self, hyp: Hypothesis, before_frame: int) -> int:
        """How many words of `hyp` (its forced ones included) were heard whole before `before_frame`.

        Generation is read up to the first token the alignment heads placed at or after that
        frame; a word that token continues was not heard whole. The window's opening timestamp
        is not read: it says only that the window starts, the heads attend from it to anywhere
        (often the window's end), and a window with no word forced whose opening they placed
        there heard no word however long it grew. A segment's closing timestamp is read: placed
        late, the segment's end was not heard yet, and the words after it wait.
        """
        words = 0
        for i, (count, at_edge) in enumerate(self.word_starts(hyp.token_ids)):
            generated = i - hyp.num_forced
            opening = i == 0 and hyp.token_ids[0] >= self.timestamp_begin
            if not opening and generated >= 0 and hyp.frames[generated] >= before_frame:
                return words if at_edge else words - 1
            words += count
        return words

    def window_prefix(
        self, tokens: list[int], skip_words: int, keep_words: int, shift_seconds: float
    ) -> list[int]:
        """The tokens of words `[skip, skip + keep)` of a hypothesis, to force on the next decode.

        They start with the timestamp that opened their segment; when the window moved
        `shift_seconds` forward, every timestamp moves back with it.
        """
        if keep_words == 0:
            return []
        shift = round(shift_seconds / SECONDS_PER_TIMESTAMP)
        out: list[int] = []
        opening: int | None = None
        word = -1
        for token, (count, at_edge) in zip(tokens, self.word_starts(tokens), strict=True):
            if count and at_edge and word + 1 >= skip_words + keep_words:
                break
            word += count
            if word < skip_words:
                if token >= self.timestamp_begin:
                    opening = token
                continue
            if not out and token < self.timestamp_begin:
                out.append(opening if opening is not None else self.timestamp_begin + shift)
            out.append(token)
        return [max(self.timestamp_begin, t - shift) if t >= self.timestamp_begin else t for t in out]
