"""LocalAgreement-2 commits for a re-decoded window: text is final once two hypotheses agree."""

import re
from dataclasses import dataclass, field

from voxtral.whisper_model import Hypothesis

_PUNCT = re.compile(r"[^\w']+")


def _norm(word: str) -> str:
    return _PUNCT.sub("", word.lower())


@dataclass
class WindowCommit:
    text: str  # newly committed text, to append to the transcript
    trim_seconds: float = 0.0  # how far the window start may move forward
    # Nothing in the window is still needed: it may move to its end (keeping a short
    # tail when nothing was said, in case speech is just starting).
    clear: bool = False


@dataclass
class LocalAgreement:
    """Commit state of one session's window.

    `window_words` are committed words heard in the current window: every new
    hypothesis of that window starts with them. `pending` is the previous
    hypothesis's uncommitted tail; its prefix shared with the new tail is committed.
    Once a whole segment (Whisper timestamps) is committed, the window may move past it.
    """

    window_words: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)

    def _after_committed(self, words: list[str]) -> list[str]:
        """The hypothesis past the window's committed words, which it re-transcribes.

        The model may re-word them ("sea shells" for "seashells"): then find where the last
        committed words end in it, near where counting would put them.
        """
        n = len(self.window_words)
        committed = [_norm(w) for w in self.window_words]
        said = [_norm(w) for w in words]
        if said[:n] == committed:
            return words[n:]
        for m in range(min(4, n), 0, -1):
            for j in sorted(range(m, len(words) + 1), key=lambda j: abs(j - n)):
                if abs(j - n) > 3:
                    break
                if said[j - m : j] == committed[-m:]:
                    return words[j:]
        return words[n:]

    def update(self, hyp: Hypothesis | None, final: bool, force_trim: bool) -> WindowCommit:
        """`hyp` None means no speech in the window; `force_trim` that the window is too long."""
        if hyp is None:
            self.pending = []
            return WindowCommit("", clear=not self.window_words)
        words: list[str] = []
        segment_ends: list[tuple[int, float | None]] = []  # (words through this segment, end)
        for segment in hyp.segments:
            words += segment.text.split()
            segment_ends.append((len(words), segment.end))
        tail = self._after_committed(words)
        if final:
            agreed = len(tail)
        else:
            agreed = 0
            for new, old in zip(tail, self.pending, strict=False):
                if _norm(new) != _norm(old):
                    break
                agreed += 1
        clear = final
        if force_trim and not final:
            closed = [n for n, end in segment_ends[:-1] if end is not None]
            agreed = max(agreed, (closed[-1] if closed else len(words)) - len(self.window_words))
            clear = not closed
        committed = tail[:agreed]
        self.pending = tail[agreed:]
        self.window_words += committed
        if clear:
            self.window_words, self.pending = [], []
            return WindowCommit(" ".join(committed), clear=True)
        trim, consumed = 0.0, 0
        for through, end in segment_ends:
            if end is not None and through <= len(self.window_words):
                trim = end
                consumed = through
        if trim > 0:
            self.window_words = self.window_words[consumed:]
        return WindowCommit(" ".join(committed), trim_seconds=trim)
