"""What a decoded window commits: the policy's decision (`WindowCommitter`) applied to its
utterance's stream state, and where the window moves next."""

from dataclasses import replace
from functools import cache

from voxtral.runner import TimedWord, UtteranceOutput
from voxtral.whisper.hypothesis import Hypothesis
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.policy import WhisperPolicy, WindowCommitter
from voxtral.whisper.stream import POSITIONS_PER_SECOND, WhisperStream, Window
from voxtral.whisper.timing import timed_words
from voxtral.whisper.words import TokenWords


def leave_silence(state: WhisperStream, until: int, p: WhisperPolicy) -> None:
    """The window need not hold the silence before `until`: past the context's time the last
    turn is dropped, and a window without one keeps a lead-in (the VAD reports starts late)."""
    if state.committer.window_words and (
        until - state.heard_until > p.context_silence_seconds * POSITIONS_PER_SECOND
    ):
        state.committer = WindowCommitter(agree=state.committer.agree, spaced=state.committer.spaced)
        state.prefix, state.draft = [], []
    if not state.committer.window_words:
        state.window_start = max(state.window_start, until - round(p.lead_in_seconds * POSITIONS_PER_SECOND))


def _timed(window: Window, aligned: list[TimedWord], words: list[str], first: int) -> list[TimedWord]:
    """The committed `words` (the hypothesis's from `first`, `aligned` its words timed in the
    window) on the utterance's clock, in order: a word aligned in an earlier window is not
    passed by one aligned in this one."""
    state, out = window.state, []
    for word, timed in zip(words, aligned[first : first + len(words)], strict=False):
        start = max(state.words_end, window.start_seconds + timed.start)
        end = max(start, window.start_seconds + timed.end)
        out.append(replace(timed, text=word, start=round(start, 3), end=round(end, 3)))
        state.words_end = end
    return out


def commit_window(
    window: Window, hyp: Hypothesis | None, p: WhisperPolicy, token_words: TokenWords, model: WhisperModel
) -> UtteranceOutput:
    """What `hyp`, the decode of `window`, commits to its utterance, and where the window moves."""
    state = window.state
    length = window.end - state.window_start
    force = length > p.max_window_seconds * POSITIONS_PER_SECOND
    if hyp is None and not window.commit_all:
        # Nothing heard yet: the window grows, unless it is too long to be speech.
        if force:
            state.window_start = window.end - round(p.lead_in_seconds * POSITIONS_PER_SECOND)
            window.update.retain_from = state.window_start
        return UtteranceOutput(finished=False, audio_arrived_at=window.items[-1].arrived_at)
    seconds = length / POSITIONS_PER_SECOND
    # The text stops well before the audio though the turn goes on: the decoder stalled at a
    # segment's end, and so would every later decode forced the same words. Trim past them.
    # Only the turn's own speech counts: a new turn whose first words are not heard yet, after
    # a pause, has not stalled, and trimmed there it would be decoded without the turn before.
    last = hyp.segments[-1].end if hyp is not None else None
    unheard = min(seconds - last, window.speech_seconds) if last is not None else 0.0
    stalled = not window.commit_all and unheard >= p.stall_seconds
    trim_before = 0.0  # committed segments ending before this may leave the window
    if stalled:
        trim_before = seconds
    elif length > p.trim_after_seconds * POSITIONS_PER_SECOND:
        trim_before = seconds - p.trim_keep_seconds
    heard = None if window.commit_all or window.speech_seconds >= p.min_commit_seconds else 0
    if hyp is not None and heard is None:
        # Encoder frames are two mel frames; the last `holdback` of them is too fresh.
        before = (window.raw.shape[1] - round(p.holdback_seconds * POSITIONS_PER_SECOND)) // 2
        heard = token_words.words_heard(hyp, before)
    settled = 0
    if hyp is not None and heard and p.settle_seconds < seconds:
        before = (window.raw.shape[1] - round(p.settle_seconds * POSITIONS_PER_SECOND)) // 2
        settled = token_words.words_heard(hyp, before)

    @cache
    def aligned() -> list[TimedWord]:
        """The hypothesis's words timed in the window: one alignment pass, made only if asked for."""
        return timed_words(model, token_words, hyp, window.encoded, window.raw, window.prompt)

    def spoken() -> list[tuple[float, float]]:
        return [(word.start, word.end) for word in aligned()]

    # Where each word was spoken is asked only for a long window with no segment to leave by.
    long_window = hyp is not None and length > p.word_trim_after_seconds * POSITIONS_PER_SECOND
    commit = state.committer.update(
        hyp, window.commit_all, force, trim_before, seconds, heard, settled, spoken if long_window else None
    )
    # Latency counts from the arrival of the committed words' end, as the policy estimates it.
    output = UtteranceOutput(
        finished=window.final,
        turn_ended=window.commit_all and not window.final,
        audio_arrived_at=window.arrived_at(commit.end_seconds),
        interim=commit.interim,
        language=state.language if window.detected else None,
    )
    if commit.text:
        # Committed words, joined to the utterance's text so far.
        joiner = token_words.joiner
        output.text = joiner + commit.text if state.has_text else commit.text.lstrip()
        state.has_text = True
        if state.word_times:
            output.words = _timed(window, aligned(), commit.words, commit.first_word)
    if window.commit_all:
        state.heard_until = window.end
    if commit.clear:
        state.window_start, state.prefix, state.draft = window.end, [], []
    else:
        state.window_start += round(commit.trim_seconds * POSITIONS_PER_SECOND)
        if hyp is not None:
            kept = len(state.committer.window_words)
            shift = commit.trim_seconds
            state.prefix = token_words.window_prefix(hyp.token_ids, commit.consumed_words, kept, shift)
            # Everything it said after the consumed words, of which the prefix is the start.
            said = token_words.window_prefix(hyp.token_ids, commit.consumed_words, len(hyp.token_ids), shift)
            state.draft = said[len(state.prefix) :]
    state.window_start = min(state.window_start, window.end)
    if window.commit_all and state.turns:  # the silence before the next turn, heard already
        leave_silence(state, state.turns[0].start, p)
    window.update.retain_from = state.window_start
    return output
