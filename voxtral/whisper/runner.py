"""Whisper streamed: each step re-decodes every scheduled utterance's uncommitted window, batched.

The VAD (run by the engine for all utterances) says when someone speaks: a silent
utterance is not decoded, and when speech stops its window is decoded once more and
committed whole (endpointing), so the next sentence starts a fresh window.
"""

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import structlog
import torch

from scheduler import Request, RequestUpdate, SchedulerConfig, SchedulerOutput
from voxtral.audio import HOP, SAMPLE_RATE, normalize_log_mel, raw_log_mel
from voxtral.runner import StepResult, TimedWord, Transcription, UtteranceOutput, run_now, run_rows
from voxtral.whisper.decoder import pad_states
from voxtral.whisper.language import detect_languages
from voxtral.whisper.model import Hypothesis, WhisperModel
from voxtral.whisper.policy import WhisperPolicy, WindowCommitter, drop_repetition
from voxtral.whisper.stream import POSITIONS_PER_SECOND, Speech, WhisperStream, Window
from voxtral.whisper.timing import timed_words
from voxtral.whisper.words import TokenWords, is_spaced

log = structlog.get_logger(__name__)


@dataclass
class UploadDecode:
    """An upload's window decoding on the upload lane."""

    window: Window
    hypothesis: Future[list[Hypothesis | Exception | None]]
    # A turn began while it decoded, with none before it: the silence before that turn goes
    # once the window is committed (`WhisperRunner.turn`).
    silence_until: int | None = None


class WhisperRunner:
    name = "whisper"
    leading_silence_samples = 0
    history_dependent_items = False  # an item's log-mel is its content: shareable
    # Each step's commits move the window the next step reads: no step runs ahead.
    max_steps_in_flight = 1
    num_slots_in_use = 0
    word_times = True

    def __init__(self, model: WhisperModel, policy: WhisperPolicy | None = None, lanes: int = 1) -> None:
        """Runners may share a model; each engine needs its own runner (its store follows its cache).

        `lanes`: windows decoded at once, each alone on a thread of its own (on a CPU, one per
        core, torch on one thread). A batch of windows on a CPU costs about what they cost one
        by one, and torch's team of threads splitting each small product waits at every one
        for its slowest thread: one a neighbour's process holds stalls them all."""
        self.model = model
        self.lanes = lanes
        self.pool = ThreadPoolExecutor(lanes, thread_name_prefix="voxrt-lane") if lanes > 1 else None
        # Uploads (`Request.priority` > 0) decode on a thread of their own, a window at a time,
        # beside the steps of live speech: request id -> the window and its decode.
        self.upload_lane = ThreadPoolExecutor(1, thread_name_prefix="voxrt-upload")
        self.uploading: dict[str, UploadDecode] = {}
        self.device = model.device
        self.policy = policy or WhisperPolicy()
        self.chunk_samples = int(self.policy.chunk_seconds * SAMPLE_RATE) // HOP * HOP
        self.samples_per_position = HOP
        self.step_period_seconds = self.policy.step_period_seconds
        self.full_window_seconds = self.policy.trim_after_seconds
        self.store: dict[str, torch.Tensor] = {}  # mm_hash -> device copy of an item's log-mel
        self.languages = frozenset(model.language_ids) if model.multilingual else frozenset({"en"})
        self.translates = model.multilingual
        self.words = {
            spaced: TokenWords(model.tokenizer, model.timestamp_begin, spaced) for spaced in (True, False)
        }

    def scheduler_config(self, max_sessions: int) -> SchedulerConfig:
        # Every utterance keeps its whole window referenced: size the cache for all of them.
        window = int((self.policy.max_window_seconds + 4 * self.policy.chunk_seconds) * POSITIONS_PER_SECOND)
        return SchedulerConfig(
            max_positions_per_step=max_sessions * window,
            max_encoder_rows_per_step=max_sessions * window,
            encoder_cache_rows=max_sessions * window,
            retains_window=True,
        )

    def trailing_silence_samples(self, num_samples: int) -> int:
        return 0

    def item_features(self, samples: np.ndarray, left: np.ndarray, right: np.ndarray) -> torch.Tensor:
        return raw_log_mel(samples, left, right, self.model.n_mels)

    def new_state(self, request: Request, transcription: Transcription) -> WhisperStream:
        language = transcription.language if self.model.multilingual else "en"
        agree = self.policy.commit_policy == "local-agreement"
        committer = WindowCommitter(agree=agree, spaced=is_spaced(language))
        previous = self.model.previous_text(transcription.prompt)
        return WhisperStream(
            committer,
            language=language,
            task=transcription.task,
            previous=previous,
            word_times=transcription.word_times or transcription.speakers,
        )

    def full_window_cost(self) -> float:
        """Seconds a full window's decode takes on this machine, timed on dummy ones: one on
        every lane at once, as a loaded step decodes them (the lanes share the GIL and the
        memory bus; one alone ran faster than each of two together, and admission seated
        sessions that were shed once their windows had grown)."""
        p = self.policy
        window = round(self.full_window_seconds * POSITIONS_PER_SECOND)
        frames = p.encoder_frames(window, POSITIONS_PER_SECOND, self.model.max_frames)

        def decode() -> None:
            self.model.profile(frames, p.full_window_read_tokens, p.full_window_generated_tokens)

        timings = []
        for _ in range(2):  # the first also sets the kernels up
            started = time.perf_counter()
            if self.pool is None:
                decode()
            else:
                for lane in [self.pool.submit(decode) for _ in range(self.lanes)]:
                    lane.result()
            timings.append(time.perf_counter() - started)
        return min(timings)

    def detokenize(self, state: WhisperStream, token_ids: list[int], final: bool) -> str:
        """Whisper commits text, not sampled ids: only ever called with none."""
        return self.model.tokenizer.decode(token_ids)

    def turn(self, state: WhisperStream, speaking: bool, position: int) -> None:
        if not speaking:
            if state.turns:
                state.turns[-1].stop = position
            return
        if not state.turns:  # everything before is committed: its silence may go
            decoding = next((d for d in self.uploading.values() if d.window.state is state), None)
            if decoding is None:
                self._leave_silence(state, position)
            else:  # once the upload's window in decoding is committed: until then it is the lane's
                decoding.silence_until = position
        state.turns.append(Speech(position))

    def _leave_silence(self, state: WhisperStream, until: int) -> None:
        """The window need not hold the silence before `until`: past the context's time the last
        turn is dropped, and a window without one keeps a lead-in (the VAD reports starts late)."""
        p = self.policy
        if state.committer.window_words and (
            until - state.heard_until > p.context_silence_seconds * POSITIONS_PER_SECOND
        ):
            state.committer = WindowCommitter(agree=state.committer.agree, spaced=state.committer.spaced)
            state.prefix, state.draft = [], []
        if not state.committer.window_words:
            state.window_start = max(
                state.window_start, until - round(p.lead_in_seconds * POSITIONS_PER_SECOND)
            )

    def _due_from(self, state: WhisperStream) -> int | None:
        """Where the audio of a turn going on is enough for its next decode: heard long enough
        (to detect its language, if unknown), and `update_seconds` past the last decode."""
        if not state.turns or state.turns[0].stop is not None:
            return None
        p = self.policy
        least = p.min_decode_seconds
        if not state.language:  # its next guess at the language
            least = p.detect_language_seconds * (len(state.language_guesses) + 1)
        update = round(p.update_seconds * POSITIONS_PER_SECOND)
        return max(state.turns[0].start + round(least * POSITIONS_PER_SECOND), state.decoded_until + update)

    def release(self, state: WhisperStream) -> None:
        """An upload's window in decoding is dropped (its decode ends on its own); nothing else is
        per-utterance: the window lives in the encoder cache."""
        for request_id, decoding in list(self.uploading.items()):
            if decoding.window.state is state:
                del self.uploading[request_id]

    def submit(self, out: SchedulerOutput, states: dict[str, WhisperStream]) -> Future[StepResult]:
        return run_now(self.execute, out, states)

    def execute(self, out: SchedulerOutput, states: dict[str, WhisperStream]) -> StepResult:
        for mm_hash in out.freed_mm_hashes:
            self.store.pop(mm_hash, None)
        for _, item in out.encoder_inputs:
            self.store[item.mm_hash] = item.features.to(self.device, non_blocking=True)
        result = StepResult()
        step = {
            s.request.request_id: (s.request, states[s.request.request_id], s.end, s.final)
            for s in out.scheduled
        }
        # What this step decides about each request's window, handed back as its output.
        updates = {rid: RequestUpdate(request.retain_from, None) for rid, (request, *_) in step.items()}
        for request, state, end, final in step.values():
            if request.priority:
                self._upload_step(request, state, end, final, updates[request.request_id], result)
        # The longest due first (a turn that ended, None, takes no room: any place will do).
        due = sorted((d for d in step.values() if not d[0].priority), key=lambda d: self._due_from(d[1]) or 0)
        going_on = 0  # windows of turns going on planned this step
        # Rounds: a window that committed a turn whole, with more turns heard behind it, is
        # planned again on the same audio (only a faster-than-real-time client gets there).
        while due:
            windows = []
            for request, state, end, final in due:
                try:
                    room = going_on < self.policy.max_windows_per_step * self.lanes
                    update = updates[request.request_id]
                    turns = len(state.turns)
                    if (window := self._plan(request, state, end, final, room, update)) is not None:
                        windows.append(window)
                        going_on += not window.commit_all
                    else:
                        self._nothing_to_decode(request, state, final, result, turns)
                except Exception as fault:
                    result.failed[request.request_id] = fault
            for window, hyp in zip(windows, self._decode(windows), strict=True):
                self._deliver(window, hyp, result)
            due = [
                step[w.request.request_id]
                for w in windows
                if w.commit_all and w.state.turns and w.request.request_id not in result.failed
            ]
        for request_id, update in updates.items():
            if request_id not in result.failed:
                result.last(request_id).update = update
        return result

    def _upload_step(
        self,
        request: Request,
        state: WhisperStream,
        end: int,
        final: bool,
        update: RequestUpdate,
        result: StepResult,
    ) -> None:
        """An upload's window decodes on a lane of its own, one at a time, while the steps of
        live speech go on beside it; the first step after it is done delivers it."""
        request_id = request.request_id
        try:
            if (decoding := self.uploading.get(request_id)) is not None:
                if not decoding.hypothesis.done():
                    update.waiting_from = state.window_start  # decoding: not done
                    return
                del self.uploading[request_id]
                (hyp,) = decoding.hypothesis.result()
                self._deliver(replace(decoding.window, update=update), hyp, result)
                if request_id in result.failed or decoding.window.final:
                    return
                if decoding.silence_until is not None:
                    self._leave_silence(state, decoding.silence_until)
            if self.uploading:  # another upload's window has the lane
                update.waiting_from = state.window_start
                return
            # Decoded whole once it ends, as a file is transcribed offline (the rest is coming),
            # unless more of it is here than one decode reads.
            turn = state.turns[0] if state.turns else None
            if turn and turn.stop is None and not final and end - state.window_start < self.model.max_frames:
                return
            turns = len(state.turns)
            if (window := self._plan(request, state, end, final, True, update)) is None:
                self._nothing_to_decode(request, state, final, result, turns)
                return
            hypothesis = self.upload_lane.submit(self._decode_lane, [window])
            self.uploading[request_id] = UploadDecode(window, hypothesis)
            update.waiting_from = state.window_start
        except Exception as fault:
            result.failed[request_id] = fault

    def _nothing_to_decode(
        self, request: Request, state: WhisperStream, final: bool, result: StepResult, turns: int
    ) -> None:
        """A request planned no window: it may be finished, or a turn of it may have ended."""
        if final:
            result.add(request.request_id, UtteranceOutput(finished=True))
        elif len(state.turns) < turns:  # a turn ended with nothing left to decode
            result.add(request.request_id, UtteranceOutput(turn_ended=True))

    def _deliver(self, window: Window, hyp: Hypothesis | Exception | None, result: StepResult) -> None:
        """A decoded window committed, its output added to the step's result."""
        request_id = window.request.request_id
        if isinstance(hyp, Exception):
            result.failed[request_id] = hyp
            return
        try:
            output = self._commit(window, hyp)
        except Exception as fault:
            result.failed[request_id] = fault
            return
        output.num_tokens = len(hyp.token_ids) if hyp is not None else 0
        output.window_seconds = window.raw.shape[1] / POSITIONS_PER_SECOND
        if output.text or output.finished or output.num_tokens or output.turn_ended:
            result.add(request_id, output)

    def _plan(
        self, request: Request, state: WhisperStream, end: int, final: bool, room: bool, update: RequestUpdate
    ) -> Window | None:
        """The window to decode this step, if any: the oldest turn heard, once its end (and a
        short tail) has arrived, to commit whole; or, with `room` in the step, the turn going on,
        heard long and newly enough. What it decides about the request goes into `update`."""
        p = self.policy
        update.waiting_from = None
        turn = state.turns[0] if state.turns else None
        if turn is None or end <= turn.start:
            # Silence: nothing to decode, and the window need not keep it.
            self._leave_silence(state, end)
            update.retain_from = state.window_start
            return None
        # What one decode reads: audio that came faster than real time may hold more.
        longest = state.window_start + self.model.max_frames
        ended = turn.stop is not None or final  # the turn ended, or the input did
        if ended:
            tail = round(p.endpoint_tail_seconds * POSITIONS_PER_SECOND)
            stop = end if turn.stop is None else turn.stop + tail
            if end < stop and not final:
                return None  # the audio after the turn's end is yet to come
            end = min(end, stop)
            if end > longest:
                # Decoded a window at a time as a turn going on, the next from the next step.
                end, ended = longest, False
                update.waiting_from = longest
            else:
                state.turns.popleft()
        elif end < self._due_from(state):
            return None
        elif not room:
            # Planned again next step, whether audio came or not; behind real time from where
            # its decode fell due (`WhisperPolicy.max_windows_per_step`).
            update.waiting_from = self._due_from(state)
            return None
        end = min(end, longest)
        if end <= state.window_start:
            return None
        ids = request.input_ids_in_window(state.window_start, end)
        items = [request.item(i) for i in ids]
        raw = torch.cat([self.store[item.mm_hash] for item in items], dim=1)
        raw = raw[:, state.window_start - items[0].offset : end - items[0].offset]
        state.decoded_until = end
        heard = (end - turn.start) / POSITIONS_PER_SECOND
        return Window(request, state, update, raw, end, final and not state.turns, ended, items, heard)

    def _decode(self, windows: list[Window]) -> list[Hypothesis | Exception | None]:
        """Each window's hypothesis (None: silence, or its language still unknown), the windows
        shared out among the lanes."""
        if self.pool is None or len(windows) < 2:
            return self._decode_lane(windows)
        shares = [
            list(range(lane, len(windows), self.lanes)) for lane in range(min(self.lanes, len(windows)))
        ]
        decoding = [self.pool.submit(self._decode_lane, [windows[i] for i in share]) for share in shares]
        out: list[Hypothesis | Exception | None] = [None] * len(windows)
        for share, lane in zip(shares, decoding, strict=True):
            for i, hyp in zip(share, lane.result(), strict=True):
                out[i] = hyp
        return out

    def _decode_lane(self, windows: list[Window]) -> list[Hypothesis | Exception | None]:
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

    def _timed(self, window: Window, hyp: Hypothesis, words: list[str], first: int) -> list[TimedWord]:
        """The committed `words` (`hyp`'s from `first`) on the utterance's clock, in order: a word
        aligned in an earlier window is not passed by one aligned in this one."""
        state, out = window.state, []
        token_words = self.words[state.committer.spaced]
        aligned = timed_words(self.model, token_words, hyp, window.encoded, window.raw, window.prompt)
        for word, timed in zip(words, aligned[first : first + len(words)], strict=False):
            start = max(state.words_end, window.start_seconds + timed.start)
            end = max(start, window.start_seconds + timed.end)
            out.append(replace(timed, text=word, start=round(start, 3), end=round(end, 3)))
            state.words_end = end
        return out

    def _encode(self, window: Window) -> torch.Tensor:
        """(frames, width): the window and the silence after it (`WhisperPolicy.encoder_frames`)."""
        n = self.policy.encoder_frames(window.raw.shape[1], POSITIONS_PER_SECOND, self.model.max_frames)
        return self.model.encode(normalize_log_mel(window.raw[:, :n], n)[None])[0]

    def _commit(self, window: Window, hyp: Hypothesis | None) -> UtteranceOutput:
        state, p = window.state, self.policy
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
        last = hyp.segments[-1].end if hyp is not None else None
        stalled = last is not None and not window.commit_all and seconds - last >= p.stall_seconds
        trim_before = 0.0  # committed segments ending before this may leave the window
        if stalled:
            trim_before = seconds
        elif length > p.trim_after_seconds * POSITIONS_PER_SECOND:
            trim_before = seconds - p.trim_keep_seconds
        heard = None if window.commit_all or window.speech_seconds >= p.min_commit_seconds else 0
        if hyp is not None and heard is None:
            # Encoder frames are two mel frames; the last `holdback` of them is too fresh.
            before = (window.raw.shape[1] - round(p.holdback_seconds * POSITIONS_PER_SECOND)) // 2
            heard = self.words[state.committer.spaced].words_heard(hyp, before)
        settled = 0
        if hyp is not None and heard and p.settle_seconds < seconds:
            before = (window.raw.shape[1] - round(p.settle_seconds * POSITIONS_PER_SECOND)) // 2
            settled = self.words[state.committer.spaced].words_heard(hyp, before)
        commit = state.committer.update(hyp, window.commit_all, force, trim_before, seconds, heard, settled)
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
            joiner = self.words[state.committer.spaced].joiner
            output.text = joiner + commit.text if state.has_text else commit.text.lstrip()
            state.has_text = True
            if state.word_times:
                output.words = self._timed(window, hyp, commit.words, commit.first_word)
        if window.commit_all:
            state.heard_until = window.end
        if commit.clear:
            state.window_start, state.prefix, state.draft = window.end, [], []
        else:
            state.window_start += round(commit.trim_seconds * POSITIONS_PER_SECOND)
            if hyp is not None:
                words = self.words[state.committer.spaced]
                kept = len(state.committer.window_words)
                shift = commit.trim_seconds
                state.prefix = words.window_prefix(hyp.token_ids, commit.consumed_words, kept, shift)
                # Everything it said after the consumed words, of which the prefix is the start.
                said = words.window_prefix(hyp.token_ids, commit.consumed_words, len(hyp.token_ids), shift)
                state.draft = said[len(state.prefix) :]
        state.window_start = min(state.window_start, window.end)
        if window.commit_all and state.turns:  # the silence before the next turn, heard already
            self._leave_silence(state, state.turns[0].start)
        window.update.retain_from = state.window_start
        return output
