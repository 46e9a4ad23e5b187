"""Whisper streamed: each step re-decodes every scheduled utterance's uncommitted window, batched.

The VAD (run by the engine for all utterances) says when someone speaks: a silent
utterance is not decoded, and when speech stops its window is decoded once more and
committed whole (endpointing), so the next sentence starts a fresh window.
"""

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import torch

from scheduler import Request, RequestKind, RequestUpdate, SchedulerConfig, SchedulerOutput
from voxtral.audio import HOP, SAMPLE_RATE, raw_log_mel
from voxtral.runner import ModelSpec, StepResult, Transcription, UtteranceOutput, run_now
from voxtral.whisper.commit import commit_window, leave_silence
from voxtral.whisper.hypothesis import Hypothesis
from voxtral.whisper.lanes import WindowDecoder
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.policy import WhisperPolicy, WindowCommitter
from voxtral.whisper.stream import POSITIONS_PER_SECOND, Speech, WhisperStream, Window
from voxtral.whisper.words import TokenWords, is_spaced

UPLOAD_LANES = 1  # uploads' windows decoding at once, beside live speech's steps


@dataclass
class UploadDecode:
    """An upload's window decoding on the upload lane."""

    window: Window
    hypothesis: Future[list[Hypothesis | Exception | None]]
    # A turn began while it decoded, with none before it: the silence before that turn goes
    # once the window is committed (`WhisperRunner.turn`).
    silence_until: int | None = None


def served_policy(model: WhisperModel) -> WhisperPolicy:
    """The policy a model is served with. The multilingual model's encoder reads a window
    committed whole (a turn's end, an upload's) padded to its full 30 s, as it was trained:
    padded to 10 s, whisper-base heard a Spanish sentence at 81 % WER where `generate` heard it
    at 31 %. A turn going on is decoded every half second, its first decodes of a second or
    two: padded to 30 s, base heard a French passage streamed at 57 % WER against 26-34 %."""
    if model.multilingual:
        return WhisperPolicy(min_whole_encoder_seconds=model.max_frames / POSITIONS_PER_SECOND)
    return WhisperPolicy()


class WhisperRunner:
    num_slots_in_use = 0  # a window lives in the encoder cache, not in device state

    def __init__(self, model: WhisperModel, policy: WhisperPolicy | None = None, lanes: int = 1) -> None:
        """Runners may share a model; each engine needs its own runner (its store follows its cache).
        `lanes`: windows decoded at once (`WindowDecoder`)."""
        self.model = model
        self.policy = policy or served_policy(model)
        self.decoder = WindowDecoder(model, self.policy, lanes)
        # Uploads (`RequestKind.UPLOAD`) decode on a thread of their own, a window at a time,
        # beside the steps of live speech (the scheduler runs one upload a step: the one whose
        # window decodes here, until it is delivered): request id -> the window and its decode.
        self.upload_lane = ThreadPoolExecutor(UPLOAD_LANES, thread_name_prefix="voxrt-upload")
        self.uploading: dict[str, UploadDecode] = {}
        self.spec = ModelSpec(
            name="whisper",
            device=model.device,
            precision=model.cpu_weights or str(model.dtype).removeprefix("torch."),
            chunk_samples=int(self.policy.chunk_seconds * SAMPLE_RATE) // HOP * HOP,
            samples_per_position=HOP,
            leading_silence_samples=0,
            history_dependent_items=False,  # an item's log-mel is its content: shareable
            step_period_seconds=self.policy.step_period_seconds,
            full_window_seconds=self.policy.trim_after_seconds,
            # Each step's commits move the window the next step reads: no step runs ahead.
            max_steps_in_flight=1,
            lanes=self.decoder.lanes,
            languages=frozenset(model.language_ids) if model.multilingual else frozenset({"en"}),
            translates=model.multilingual,
            word_times=True,
            decodes_by_turns=True,  # a turn's end commits its window whole; silence is skipped
        )
        self.store: dict[str, torch.Tensor] = {}  # mm_hash -> device copy of an item's log-mel
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
            # Its "encoder outputs" are the log-mel the feature cache holds too: identical audio
            # is found there, and kept here as well the same bytes would be held twice.
            keep_unreferenced_encoder_outputs=False,
            retains_window=True,
            max_uploads_per_step=UPLOAD_LANES,
        )

    def trailing_silence_samples(self, num_samples: int) -> int:
        return 0

    def item_features(self, samples: np.ndarray, left: np.ndarray, right: np.ndarray) -> torch.Tensor:
        return raw_log_mel(samples, left, right, self.model.n_mels)

    def new_state(self, request: Request, transcription: Transcription) -> WhisperStream:
        language = transcription.language if self.model.multilingual else "en"
        agree = self.policy.commit_policy == "local-agreement"
        committer = WindowCommitter(agree=agree, spaced=is_spaced(language))
        previous = self.model.previous_text(transcription.prompt, transcription.keyterms)
        return WhisperStream(
            committer,
            language=language,
            task=transcription.task,
            previous=previous,
            word_times=transcription.word_times or transcription.speakers,
        )

    def full_window_cost(self) -> float:
        """Seconds a full window's decode takes on this machine, timed on a dummy one:
        admission's prior until sessions' own are measured."""
        return self.decoder.full_window_cost(self.spec.full_window_seconds)

    def turn(self, state: WhisperStream, speaking: bool, position: int) -> None:
        if not speaking:
            if state.turns:
                state.turns[-1].stop = position
            return
        if not state.turns:  # everything before is committed: its silence may go
            decoding = next((d for d in self.uploading.values() if d.window.state is state), None)
            if decoding is None:
                leave_silence(state, position, self.policy)
            else:  # once the upload's window in decoding is committed: until then it is the lane's
                decoding.silence_until = position
        state.turns.append(Speech(position))

    def pause(self, state: WhisperStream, position: int | None) -> None:
        state.pause_from = position

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
            self.store[item.mm_hash] = item.features.to(self.spec.device, non_blocking=True)
        result = StepResult()
        step = {
            s.request.request_id: (s.request, states[s.request.request_id], s.end, s.final)
            for s in out.scheduled
        }
        # What this step decides about each request's window, handed back as its output.
        updates = {rid: RequestUpdate(request.retain_from, None) for rid, (request, *_) in step.items()}
        for request, state, end, final in step.values():
            if request.kind is RequestKind.UPLOAD:
                self._upload_step(request, state, end, final, updates[request.request_id], result)
        # The longest due first; a turn that ended before any (it is never left for a later step).
        due = sorted(
            (d for d in step.values() if d[0].kind is RequestKind.LIVE),
            key=lambda d: d[1].due_since(self.policy, d[0], d[2]),
        )
        # Windows planned this step. A turn that ended is always planned, and takes room as a
        # window going on would: a lane's share of the step, and so the step's length, stays
        # bounded, and the words of that turn's end wait for no more than it.
        planned = 0
        # Rounds: a window that committed a turn whole, with more turns heard behind it, is
        # planned again on the same audio (only a faster-than-real-time client gets there).
        while due:
            windows = []
            for request, state, end, final in due:
                try:
                    room = planned < self.policy.max_windows_per_step * self.spec.lanes
                    update = updates[request.request_id]
                    turns = len(state.turns)
                    if (window := self._plan(request, state, end, final, room, update)) is not None:
                        windows.append(window)
                        planned += window.hypothesis is None
                    else:
                        self._nothing_to_decode(request, state, final, result, turns)
                except Exception as fault:
                    result.failed[request.request_id] = fault
            decoded = iter(self.decoder.decode([w for w in windows if w.hypothesis is None]))
            for window in windows:
                hyp = next(decoded) if window.hypothesis is None else window.hypothesis
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
        """An upload's window decodes on the upload lane while the steps of live speech go on
        beside it; the first step after it is done delivers it."""
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
                    leave_silence(state, decoding.silence_until, self.policy)
            # Decoded whole once it ends, as a file is transcribed offline (the rest is coming),
            # unless more of it is here than one decode reads.
            turn = state.turns[0] if state.turns else None
            if turn and turn.stop is None and not final and end - state.window_start < self.model.max_frames:
                return
            turns = len(state.turns)
            if (window := self._plan(request, state, end, final, True, update)) is None:
                self._nothing_to_decode(request, state, final, result, turns)
                return
            hypothesis = self.upload_lane.submit(self.decoder.decode_lane, [window])
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
            output = commit_window(
                window, hyp, self.policy, self.words[window.state.committer.spaced], self.model
            )
        except Exception as fault:
            result.failed[request_id] = fault
            return
        if window.hypothesis is None:  # decoded now, not an earlier decode committed whole
            output.num_tokens = len(hyp.token_ids) if hyp is not None else 0
        output.window_seconds = window.raw.shape[1] / POSITIONS_PER_SECOND
        # What a turn going on said may stand for the decode of its end (`WhisperStream.heard_through`);
        # an upload's end is decoded as a file is.
        kept = not window.commit_all and hyp is not None and window.request.kind is RequestKind.LIVE
        window.state.last_decode = replace(window, hypothesis=hyp) if kept else None
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
            leave_silence(state, end, self.policy)
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
                if (heard := state.heard_through(end)) is not None:
                    return replace(
                        heard, update=update, final=final and not state.turns, commit_all=True, detected=False
                    )
        elif end < state.due_from(self.policy):
            return None
        elif not room:
            # Planned again next step, whether audio came or not; behind real time from where
            # its decode fell due (`WhisperPolicy.max_windows_per_step`).
            update.waiting_from = state.due_from(self.policy)
            return None
        end = min(end, longest)
        if end <= state.window_start:
            return None
        ids = request.input_ids_in_window(state.window_start, end)
        items = [request.item(i) for i in ids]
        raw = torch.cat([self.store[item.mm_hash] for item in items], dim=1)
        raw = raw[:, state.window_start - items[0].offset : end - items[0].offset]
        state.decoded_until, state.decoded_at = end, time.monotonic()
        heard = (end - turn.start) / POSITIONS_PER_SECOND
        return Window(request, state, update, raw, end, final and not state.turns, ended, items, heard)
