"""Windows decoded: each encoded at its own length, then decoded in batches a fault cannot
spread through, the windows of a step shared out among lanes (threads, one per core)."""

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from voxtral.audio import normalize_log_mel
from voxtral.runner import run_rows
from voxtral.whisper.decoder import pad_states
from voxtral.whisper.hypothesis import Hypothesis
from voxtral.whisper.language import detect_languages
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.pieces import joined, quietest, through_segments
from voxtral.whisper.policy import WhisperPolicy, drop_repetition
from voxtral.whisper.stream import POSITIONS_PER_SECOND, Window


class WindowDecoder:
    def __init__(self, model: WhisperModel, policy: WhisperPolicy, lanes: int) -> None:
        """`lanes`: shares of a step's windows decoded at once, each share in one batch on a
        thread of its own (on a CPU, one per core, torch on one thread). Rows of a batch share
        each token's read of the decoder's weights; torch's team of threads splitting each
        small product instead waits at every one for its slowest thread: one a neighbour's
        process holds stalls them all."""
        self.model = model
        self.policy = policy
        self.lanes = lanes
        self.pool = ThreadPoolExecutor(lanes, thread_name_prefix="voxrt-lane") if lanes > 1 else None

    def full_window_cost(self, seconds: float) -> float:
        """A lane's seconds per full window (`seconds` long) in a loaded step on this machine,
        timed on dummy ones: a step's share on every lane at once, each lane's decoded
        together, as a loaded step decodes them (the lanes share the GIL and the memory bus;
        one alone ran faster than each of two together, and admission seated sessions that
        were shed once their windows had grown)."""
        p = self.policy
        window = round(seconds * POSITIONS_PER_SECOND)
        frames = p.encoder_frames(window, POSITIONS_PER_SECOND, self.model.max_frames)
        rows = p.max_windows_per_step

        def decode() -> None:
            self.model.profile(frames, p.full_window_read_tokens, p.full_window_generated_tokens, rows)

        timings = []
        for _ in range(2):  # the first also sets the kernels up
            started = time.perf_counter()
            if self.pool is None:
                decode()
            else:
                for lane in [self.pool.submit(decode) for _ in range(self.lanes)]:
                    lane.result()
            timings.append(time.perf_counter() - started)
        return min(timings) / rows

    def decode(self, windows: list[Window]) -> list[Hypothesis | Exception | None]:
        """Each window's hypothesis (None: silence, or its language still unknown), the windows
        shared out among the lanes."""
        if self.pool is None or len(windows) < 2:
            return self.decode_lane(windows)
        shares = [
            list(range(lane, len(windows), self.lanes)) for lane in range(min(self.lanes, len(windows)))
        ]
        decoding = [self.pool.submit(self.decode_lane, [windows[i] for i in share]) for share in shares]
        out: list[Hypothesis | Exception | None] = [None] * len(windows)
        for share, lane in zip(shares, decoding, strict=True):
            for i, hyp in zip(share, lane.result(), strict=True):
                out[i] = hyp
        return out

    def decode_lane(self, windows: list[Window]) -> list[Hypothesis | Exception | None]:
        """Each window's hypothesis, in batches that a fault cannot spread through: a window
        whose decode fails alone gets its exception."""
        out: list[Hypothesis | Exception | None] = run_rows(self._detect_languages, windows)
        known = [i for i, w in enumerate(windows) if out[i] is None and w.state.language]
        if known:
            for i, hyp in zip(known, run_rows(self._decode_batch, [windows[i] for i in known]), strict=True):
                out[i] = hyp
        return out

    def _detect_languages(self, windows: list[Window]) -> list[None]:
        detect_languages(self.model, self.policy, windows)
        return [None] * len(windows)

    def _decode_batch(self, windows: list[Window]) -> list[Hypothesis | None]:
        forced = [w.state.prefix for w in windows]
        hyps = self._decode(windows, forced, [w.state.draft for w in windows])
        return [self._whole(w, hyp) for w, hyp in zip(windows, hyps, strict=True)]

    def _decode(
        self, windows: list[Window], forced: list[list[int]], drafts: list[list[int]]
    ) -> list[Hypothesis]:
        """Each window's greedy decode, its segments past a loop dropped (`drop_repetition`)."""
        p = self.policy
        # Each window is encoded at its own length: its text does not depend on the windows beside it.
        states, lengths = pad_states([self._encode(w) for w in windows])
        # The window's committed words are forced, not prompted (<|startofprev|>): with them
        # as a prompt tiny.en skips the prompted words and stops closing timestamps, and the
        # window could no longer be trimmed. The prompt holds only the client's text.
        prompts = [self.model.prompt(w.state.language, w.state.task, w.state.previous) for w in windows]
        most, per_frame = self.model.max_target_positions // 2, p.tokens_per_second / POSITIONS_PER_SECOND
        budgets = [
            min(most, int(w.raw.shape[1] * per_frame) + 10, self.model.max_target_positions - len(a) - len(f))
            for w, a, f in zip(windows, prompts, forced, strict=True)
        ]
        hyps = self.model.decode(states, budgets, forced, prompts, lengths, drafts)
        for row, (window, hyp) in enumerate(zip(windows, hyps, strict=True)):
            # Timestamps past the window's audio are the model's guess into the silence padded
            # after it: a trim there skipped speech not yet transcribed (a whole sentence's start).
            last = self.model.timestamp_begin + window.raw.shape[1] // 2  # one per two positions
            hyp.token_ids = [min(t, last) for t in hyp.token_ids]
            segments = self.model.segments(hyp.token_ids)
            seconds = window.raw.shape[1] / POSITIONS_PER_SECOND
            hyp.segments = drop_repetition(segments, p.max_compression_ratio, seconds)
            hyp.looped |= len(hyp.segments) < len(segments)
            # Kept to time the words this decode commits, or to place them for a trim.
            window.encoded, window.prompt = states[row, : lengths[row]], prompts[row]
        return hyps

    def _silent(self, hyp: Hypothesis) -> bool:
        """Whisper's test for a window without speech; a window holding committed words has some."""
        p = self.policy
        return (
            not hyp.num_forced and hyp.no_speech_prob > p.no_speech_prob and hyp.avg_logprob < p.logprob_floor
        )

    def _whole(self, window: Window, hyp: Hypothesis) -> Hypothesis | None:
        """`hyp`, or, where its text stops short of the window's speech, the window decoded
        again in pieces: what it said through its last closed segment and a decode of the rest,
        or, with no such segment, each half of the window (cut at its quietest moment near the
        middle). Short: a loop dropped, nothing said where Whisper hears speech, or, where the
        window's words are committed now, its text ended `min_piece_seconds` before the audio;
        not a turn going on whose committed words are forced, until its window is too long.
        A long window (a client faster than real time, an upload) looped or ended early where
        the turn decoded as it grew would not, and all of the window past that was lost."""
        if self._silent(hyp):
            return None
        piece = round(self.policy.min_piece_seconds * POSITIONS_PER_SECOND)
        length = window.raw.shape[1]
        closed = [s.end for s in hyp.segments if s.end is not None]
        heard = round(closed[-1] * POSITIONS_PER_SECOND) if closed else 0
        # Committed now: the window is committed whole, or is too long and what it says is
        # committed before it moves on (`WindowCommitter.update`'s `force_trim`).
        last = window.commit_all or length > self.policy.max_window_seconds * POSITIONS_PER_SECOND
        ended_early = last and bool(hyp.segments) and hyp.segments[-1].end is not None
        short = hyp.looped or not hyp.segments or (ended_early and length - heard >= piece)
        # A turn going on whose words are committed is decoded again half a second on, with them
        # as its context; a piece of it decoded alone loses that ("the epoch of the leaf").
        if not short or (hyp.num_forced and not last):
            return hyp if hyp.segments else None
        # The rest after what was said, each piece at least `piece` shorter than the last (a
        # window's committed words, forced, may be shorter: pieces have none).
        if closed and heard <= length - piece and (heard >= piece or hyp.num_forced):
            said = through_segments(hyp, len(closed), self.model.timestamp_begin)
            return joined(
                [(0, said), (heard, self._piece(window, heard, length))], length, self.model.timestamp_begin
            )
        if hyp.num_forced:
            # A turn's end whose committed words are forced, and nothing closed after them: the
            # whole window again, unforced; the commit finds those words in what it says.
            return self._piece(window, 0, length)
        if length < 2 * piece:
            return hyp if hyp.segments else None
        cut = quietest(window.raw, piece)
        parts = [(0, self._piece(window, 0, cut)), (cut, self._piece(window, cut, length))]
        return joined(parts, length, self.model.timestamp_begin)

    def _piece(self, window: Window, start: int, end: int) -> Hypothesis | None:
        """The part of `window` from `start` to `end` (positions), decoded whole on its own."""
        piece = replace(window, raw=window.raw[:, start:end], end=window.start + end)
        (hyp,) = self._decode([piece], [[]], [[]])
        return self._whole(piece, hyp)

    def _encode(self, window: Window) -> torch.Tensor:
        """(frames, width): the window and the silence after it (`WhisperPolicy.encoder_frames`)."""
        n = self.policy.encoder_frames(
            window.raw.shape[1], POSITIONS_PER_SECOND, self.model.max_frames, window.commit_all
        )
        return self.model.encode(normalize_log_mel(window.raw[:, :n], n)[None])[0]
