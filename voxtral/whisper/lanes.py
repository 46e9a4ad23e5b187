"""Windows decoded: each encoded at its own length, then decoded in batches a fault cannot
spread through, the windows of a step shared out among lanes (threads, one per core)."""

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from voxtral.audio import normalize_log_mel
from voxtral.runner import run_rows
from voxtral.whisper.decoder import pad_states
from voxtral.whisper.language import detect_languages
from voxtral.whisper.model import Hypothesis, WhisperModel
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
        p = self.policy
        # Each window is encoded at its own length: its text does not depend on the windows beside it.
        states, lengths = pad_states([self._encode(w) for w in windows])
        # The window's committed words are forced, not prompted (<|startofprev|>): with them
        # as a prompt tiny.en skips the prompted words and stops closing timestamps, and the
        # window could no longer be trimmed. The prompt holds only the client's text.
        forced = [w.state.prefix for w in windows]
        prompts = [self.model.prompt(w.state.language, w.state.task, w.state.previous) for w in windows]
        most, per_frame = self.model.max_target_positions // 2, p.tokens_per_second / POSITIONS_PER_SECOND
        budgets = [
            min(most, int(w.raw.shape[1] * per_frame) + 10, self.model.max_target_positions - len(a) - len(f))
            for w, a, f in zip(windows, prompts, forced, strict=True)
        ]
        drafts = [w.state.draft for w in windows]
        hyps = self.model.decode(states, budgets, forced, prompts, lengths, drafts)
        out: list[Hypothesis | None] = []
        for row, (window, hyp) in enumerate(zip(windows, hyps, strict=True)):
            # Whisper's test for a window without speech; a window holding committed words has some.
            silent = (
                not hyp.num_forced
                and hyp.no_speech_prob > p.no_speech_prob
                and hyp.avg_logprob < p.logprob_floor
            )
            # Timestamps past the window's audio are the model's guess into the silence padded
            # after it: a trim there skipped speech not yet transcribed (a whole sentence's start).
            last = self.model.timestamp_begin + window.raw.shape[1] // 2  # one per two positions
            hyp.token_ids = [min(t, last) for t in hyp.token_ids]
            segments = self.model.segments(hyp.token_ids)
            seconds = window.raw.shape[1] / POSITIONS_PER_SECOND
            hyp.segments = drop_repetition(segments, p.max_compression_ratio, seconds)
            out.append(None if silent or not hyp.segments else hyp)
            if window.state.word_times:  # kept to time the words, if this decode commits any
                window.encoded, window.prompt = states[row, : lengths[row]], prompts[row]
        return out

    def _encode(self, window: Window) -> torch.Tensor:
        """(frames, width): the window and the silence after it (`WhisperPolicy.encoder_frames`)."""
        n = self.policy.encoder_frames(window.raw.shape[1], POSITIONS_PER_SECOND, self.model.max_frames)
        return self.model.encode(normalize_log_mel(window.raw[:, :n], n)[None])[0]
