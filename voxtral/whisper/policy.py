"""What to commit from a re-decoded window: LocalAgreement-2 or AlignAtt.

Both commit only words the decoder heard before the last moments of the window (its
alignment heads attended to earlier frames: `TokenWords.words_heard`). AlignAtt
(SimulStreaming's policy) commits those at once; LocalAgreement-2 also waits until two
consecutive hypotheses agree on them, or the decoder heard them `settle_seconds` before the
window's end. Whisper's loop guard drops a hypothesis's repeating tail.
"""

import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from itertools import accumulate

from voxtral.whisper.hypothesis import Hypothesis, Segment
from voxtral.whisper.words import split_words

_PUNCT = re.compile(r"[^\w']+")
REHEARD_WORDS = 3
# Decodes in a row of a long window that heard none of their new words, after which it is
# trimmed as a too-long one: the alignment heads placed everything past the forced words at
# the window's end, and every later decode of it would too.
DEAF_DECODES = 2


def _norm(word: str) -> str:
    return _PUNCT.sub("", word.lower())


def _substitution(a: str, b: str) -> float:
    if a == b:
        return 0.0
    return 0.5 if SequenceMatcher(None, a, b).ratio() >= 0.5 else 1.0


@dataclass(frozen=True)
class Word:
    """A word of a hypothesis, as the policy weighs it."""

    text: str
    end: float  # seconds from the window's start (Whisper times segments: spread by length)
    heard: bool  # the decoder heard it before the window's last moments: it may be committed
    settled: bool  # heard so long before the window's end that it needs no agreement


@dataclass
class Said:
    """A segment of a hypothesis: its words, and where Whisper closed it (None: still open)."""

    words: list[Word]
    end: float | None


def _said(
    hyp: Hypothesis, spaced: bool, window_seconds: float, heard: int | None, settled: int
) -> list[Said]:
    """`hyp`'s segments of words; its first `heard` words (None: all) are heard, `settled` settled."""
    out: list[Said] = []
    index = 0
    for segment in hyp.segments:
        texts = split_words(segment.text, spaced)
        start, end = segment.start, segment.end or window_seconds
        total, done, words = sum(len(t) + 1 for t in texts), 0, []
        for text in texts:
            done += len(text) + 1
            at = start + (end - start) * done / total
            words.append(Word(text, at, heard is None or index < heard, index < settled))
            index += 1
        out.append(Said(words, segment.end))
    return out


def _leading(words: list[Word], holds: Callable[[Word], bool]) -> int:
    """How many of the first `words`, in a row, `holds` is true of."""
    return next((i for i, word in enumerate(words) if not holds(word)), len(words))


@dataclass
class WhisperPolicy:
    """Streaming knobs, each what it does in a line; why each default is what it is, and what
    other values did: docs/whisper-streaming.md, "The knobs"."""

    commit_policy: str = "local-agreement"  # or "alignatt" (this module's docstring)
    chunk_seconds: float = 0.1  # an item's audio: a decode reads what arrived to within this
    update_seconds: float = 0.5  # a turn going on is re-decoded once this much new audio came
    max_windows_per_step: int = 2  # per lane: windows decoded together in a step
    step_period_seconds: float = 1.0  # at full load each window is re-decoded this often
    min_decode_seconds: float = 0.5  # a turn's first decode (interim text) after this much
    min_commit_seconds: float = 1.0  # a turn's words are committed after this much of it
    detect_language_seconds: float = 2.0  # no language named: each guess after this much more
    language_sure: float = 0.7  # a guess this likely decides the language
    max_detect_seconds: float = 6.0  # after this much speech the likeliest language is taken
    max_window_seconds: float = 24.0  # past this, commit what is there and move on
    trim_after_seconds: float = 8.0  # committed segments stay in a window shorter than this
    trim_keep_seconds: float = 4.0  # a trim leaves at least this much, the next words' context
    word_trim_after_seconds: float = 12.0  # past this, committed words leave where no segment can
    stall_seconds: float = 1.0  # text ending this much before the audio: trim past it
    holdback_seconds: float = 0.6  # words heard in the window's last this-much wait
    settle_seconds: float = 1.2  # words heard this long before the window's end need no agreement
    lead_in_seconds: float = 0.5  # kept before a turn's start: the VAD reports starts late
    endpoint_tail_seconds: float = 0.3  # audio after a turn's end decoded with it
    context_silence_seconds: float = 3.0  # a longer silence ends a window's use as context
    min_encoder_seconds: float = 10.0  # shorter windows are padded to this
    min_whole_encoder_seconds: float = (
        10.0  # and a window committed whole (a turn's end, an upload's) to this
    )
    encoder_bucket_seconds: float = 1.0  # encoder lengths are rounded up to this
    no_speech_prob: float = 0.6  # with `logprob_floor`: Whisper's test for a window without speech
    logprob_floor: float = -1.0
    min_piece_seconds: float = (
        3.0  # a window whose decode stopped short is decoded again in pieces this long at least
    )
    tail_pad_seconds: float = 3.0  # silence the encoder reads after the window
    max_compression_ratio: float = 2.4  # a tail that compresses better than this is a loop
    tokens_per_second: float = 6.0  # a decode's budget: this many tokens per second of window
    # Admission's prior (`WhisperRunner.full_window_cost`): a full window's decode reads about
    # this many tokens in one pass and generates about this many.
    full_window_read_tokens: int = 30
    full_window_generated_tokens: int = 10

    def encoder_frames(self, window: int, per_second: int, most: int, whole: bool = False) -> int:
        """Mel frames the encoder reads for a window of `window` (`whole`: committed whole): the
        window and the tail's silence, rounded up to the bucket, at least the minimum and at
        most `most`."""
        bucket = round(self.encoder_bucket_seconds * per_second)
        padded = -(-(window + round(self.tail_pad_seconds * per_second)) // bucket) * bucket
        least = self.min_whole_encoder_seconds if whole else self.min_encoder_seconds
        return min(most, max(round(least * per_second), padded))


@dataclass
class WindowCommit:
    text: str  # newly committed text, to append to the transcript
    words: list[str] = field(default_factory=list)  # its words
    first_word: int = 0  # where they start among the hypothesis's words
    end_seconds: float = 0.0  # where its last word ends (estimated), from the window start
    trim_seconds: float = 0.0  # how far the window start may move forward
    consumed_words: int = 0  # words of the hypothesis that the trim dropped from the window
    interim: str = ""  # the hypothesis past the committed words: may still change
    clear: bool = False  # nothing in the window is still needed: it may move to its end


@dataclass
class WindowCommitter:
    """Commit state of one utterance's window.

    `window_words` are committed words heard in the current window: every new
    hypothesis of that window starts with them. `pending` is the previous
    hypothesis's uncommitted tail; with `agree` (LocalAgreement), only its prefix shared
    with the new tail may be committed. Once a whole segment (Whisper timestamps) is
    committed, the window may move past it.
    """

    agree: bool = True
    spaced: bool = True  # words are space-separated; else each character is one (Chinese, Japanese...)
    window_words: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    # Committed words the window start last moved past: Whisper may time a segment's end
    # early, and a window trimmed there still holds its last words.
    trimmed: list[str] = field(default_factory=list)
    deaf_decodes: int = 0  # the last decodes in a row that said new words and heard none of them

    def _heard_again(self, words: list[Word]) -> int:
        """How many of the hypothesis's first words are the last trimmed ones, heard again
        (at least `REHEARD_WORDS` in a row; fewer may be new speech that says the same)."""
        said, before = [_norm(w.text) for w in words], [_norm(w) for w in self.trimmed]
        for k in range(min(len(said), len(before)), REHEARD_WORDS - 1, -1):
            if said[:k] == before[-k:]:
                return k
        return 0

    def _after_committed(self, words: list[Word]) -> list[Word]:
        """The hypothesis past the window's committed words, which it re-transcribes.

        The model may re-word them ("sea shells" for "seashells") or drop one at the
        window's edge, so the committed words are aligned to the hypothesis prefix with
        the fewest word edits (a near-miss like "nogs"/"dogs" costs half); on a tie the
        shorter prefix wins (repeat, never lose, a word).
        """
        committed = [_norm(w) for w in self.window_words]
        said = [_norm(w.text) for w in words]
        if said[: len(committed)] == committed:
            return words[len(committed) :]
        # row[p]: edits between the committed words so far and said[:p]
        row = list(range(len(said) + 1))
        for i, word in enumerate(committed, 1):
            prev, row[0] = row[0], i
            for p in range(1, len(said) + 1):
                prev, row[p] = (
                    row[p],
                    min(row[p] + 1, row[p - 1] + 1, prev + _substitution(said[p - 1], word)),
                )
        best = min(range(len(said) + 1), key=lambda p: (row[p], p))
        return words[best:]

    def _agreed(self, tail: list[Word]) -> int:
        """How many of the new words may be committed: those the last hypothesis said too
        (LocalAgreement) or that settled, and of them only those heard (hold back the rest)."""
        agreed = len(tail)
        if self.agree:
            agreed = 0
            for new, old in zip(tail, self.pending, strict=False):
                if _norm(new.text) != _norm(old):
                    break
                agreed += 1
            agreed = max(agreed, _leading(tail, lambda word: word.settled))
        return min(agreed, _leading(tail, lambda word: word.heard))

    def update(
        self,
        hyp: Hypothesis | None,
        commit_all: bool,
        force_trim: bool,
        trim_before: float = float("inf"),
        window_seconds: float = float("inf"),
        heard_words: int | None = None,
        settled_words: int = 0,
        long_window_spans: Callable[[], list[tuple[float, float]]] | None = None,
    ) -> WindowCommit:
        """`hyp` None means no speech in the window; `commit_all` that a turn or the input ended:
        everything heard is committed (and stays in the window as context for what follows);
        `force_trim` that the window is too long;
        `trim_before` that committed segments ending before it (seconds) may leave the window;
        `heard_words` how many of the hypothesis's words were heard early enough to commit
        (None: all); `settled_words` how many were heard so early that they need no agreement;
        `long_window_spans` where each of the hypothesis's words was spoken (seconds), given only for a
        long window and asked only when no segment can leave it: its committed words leave
        instead. A long window whose decodes heard none of their new words `DEAF_DECODES` times
        in a row is trimmed as a too-long one: nothing it says would ever be heard."""
        if hyp is None:
            self.pending, self.deaf_decodes = [], 0
            return WindowCommit("", clear=not self.window_words)
        said = _said(hyp, self.spaced, window_seconds, heard_words, settled_words)
        words = [word for segment in said for word in segment.words]
        if not self.window_words:  # nothing forced: the trimmed words' audio may be heard again
            self.window_words = [w.text for w in words[: self._heard_again(words)]]
        tail = self._after_committed(words)
        first = len(words) - len(tail)
        agreed = len(tail) if commit_all else self._agreed(tail)
        self.deaf_decodes = self.deaf_decodes + 1 if tail and not _leading(tail, lambda w: w.heard) else 0
        if long_window_spans is not None and self.deaf_decodes >= DEAF_DECODES:
            force_trim, self.deaf_decodes = True, 0
        clear = False
        if force_trim and not commit_all:
            # Too long: commit through the last segment closed before the hypothesis's last one
            # (counted in the hypothesis's words, past the window's committed ones), or all of it.
            ends = _word_counts(said)
            closed = [n for n, segment in zip(ends[:-1], said[:-1], strict=True) if segment.end is not None]
            agreed = max(agreed, (closed[-1] if closed else len(words)) - len(self.window_words))
            clear = not closed
        committed, rest = tail[:agreed], tail[agreed:]
        self.pending = [w.text for w in rest]
        self.window_words += [w.text for w in committed]
        texts = [w.text for w in committed]
        end_seconds = committed[-1].end if committed else 0.0  # where the last committed word ends
        joiner = " " if self.spaced else ""
        interim = joiner.join(self.pending)
        if clear:
            self.window_words, self.pending, self.trimmed = [], [], []
            return WindowCommit(joiner.join(texts), texts, first, end_seconds, clear=True, interim=interim)
        trim, consumed = self._trim(said, force_trim, trim_before)
        if not trim and math.isfinite(trim_before) and long_window_spans is not None:
            trim, consumed = self._trim_words(long_window_spans(), len(words), trim_before)
        return WindowCommit(
            joiner.join(texts),
            texts,
            first,
            end_seconds,
            trim_seconds=trim,
            consumed_words=consumed,
            interim=interim,
        )

    def _trim(self, said: list[Said], force_trim: bool, trim_before: float) -> tuple[float, int]:
        """Where the window may start now: past the last segment whose words are all committed
        and that ended before `trim_before` (any, with `force_trim`); with the words it held."""
        trim, consumed = 0.0, 0
        for through, segment in zip(_word_counts(said), said, strict=True):
            if (
                segment.end is not None
                and through <= len(self.window_words)
                and (force_trim or segment.end <= trim_before)
            ):
                trim, consumed = segment.end, through
        if trim > 0:
            self.trimmed, self.window_words = self.window_words[:consumed], self.window_words[consumed:]
        return trim, consumed

    def _trim_words(
        self, spans: list[tuple[float, float]], words: int, trim_before: float
    ) -> tuple[float, int]:
        """Where the window may start when Whisper closed no segment that could leave it: between
        two committed words, the later one starting before `trim_before`, so that the words the
        window keeps begin with a committed one (forced on the next decode: a cut near its start
        loses nothing). A long turn said without a pause Whisper may write as one open segment,
        and its window would otherwise grow, and every decode of it cost more, until it is forced
        whole."""
        if len(spans) != words or words < len(self.window_words):
            return 0.0, 0  # the alignment counted words another way, or the decode dropped committed ones
        kept = next((k for k in range(len(self.window_words) - 1, 0, -1) if spans[k][0] <= trim_before), 0)
        if kept == 0:
            return 0.0, 0
        self.trimmed, self.window_words = self.window_words[:kept], self.window_words[kept:]
        return (spans[kept - 1][1] + spans[kept][0]) / 2, kept


def _word_counts(said: list[Said]) -> list[int]:
    """Per segment, how many of the hypothesis's words it ends after."""
    return list(accumulate(len(segment.words) for segment in said))


def compression_ratio(text: str) -> float:
    raw = text.encode()
    return len(raw) / max(1, len(zlib.compress(raw)))


LOOP_WORDS = 5  # a segment that says again this many words in a row of an earlier one may be a loop
# A repeat is a loop only where it starts this close to the end of the window's audio, or
# in the silence padded after it: people say things twice ("Do you hear me? Yes. Do you
# hear me? Yes."), and dropping every repeat lost them (`benchmarks/streaming_wer.py`).
LOOP_MARGIN_SECONDS = 0.5


def drop_repetition(segments: list[Segment], max_ratio: float, audio_seconds: float) -> list[Segment]:
    """Whisper's loop guard: text that compresses too well is the decoder repeating itself,
    and so is a segment that says again what an earlier one said at the end of the window's
    audio or past it (tiny.en, given a window's committed words, sometimes transcribes them
    a second time in the silence padded after the audio).

    Keep the segments before the loop starts; Whisper itself would re-decode at a higher
    temperature, which a re-decoded window does anyway one update later.
    """
    kept: list[Segment] = []
    seen: set[str] = set()
    said: set[tuple[str, ...]] = set()  # every run of LOOP_WORDS words of the kept segments
    for segment in segments:
        key = segment.text.strip().lower()
        words = [_norm(w) for w in segment.text.split()]
        runs = {tuple(words[i : i + LOOP_WORDS]) for i in range(len(words) - LOOP_WORDS + 1)}
        again = key in seen or bool(runs & said)
        late = segment.start >= audio_seconds - LOOP_MARGIN_SECONDS
        if (again and late) or compression_ratio(segment.text) > max_ratio:
            break
        seen.add(key)
        said |= runs
        kept.append(segment)
    return kept
