"""The step loop: one thread owns the scheduler, the caches, the utterances and the runner.

Other threads only enqueue typed commands and read the stats the loop publishes; the
events of every utterance, the audio it consumed among them, go to one listener, `on_events`,
once per step that has any, as one batch of (utterance id, event) in order.
"""

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import structlog

from cache import FeatureCache
from realtime.engine.capacity import Capacity
from realtime.engine.commands import Abort, AddUtterance, AppendAudio, Command, FinishInput
from realtime.engine.config import EngineConfig
from realtime.engine.events import AudioConsumed, EngineEvent, Failed
from realtime.engine.ingest import Ingest
from realtime.engine.stats import EngineStats
from realtime.engine.utterance import Utterances
from scheduler import RequestKind, Scheduler, SchedulerOutput
from voxtral.runner import ModelRunner, ModelSpec, StepResult, Transcription
from voxtral.speaker_encoder import SpeakerEncoder
from voxtral.turn_model import TurnModel
from voxtral.vad import Vad, VadConfig

log = structlog.get_logger(__name__)

COMMAND_WAIT_SECONDS = 0.5  # with nothing to do, how long a wait for a command lasts at most
IDLE_SECONDS = 0.01  # after a step that did nothing


class Engine:
    """Call `start`, then the thread-safe commands; or drive it with `run_once` on one thread."""

    def __init__(self, runner: ModelRunner, config: EngineConfig | None = None) -> None:
        self.runner = runner
        self.config = config or EngineConfig()
        self.scheduler = Scheduler(runner.scheduler_config(self.config.max_sessions))
        self.feature_cache = FeatureCache(self.config.feature_cache_bytes)
        self.utterances = Utterances(runner, self.scheduler, Ingest(runner, self.feature_cache), self.config)
        self.vad = Vad()
        self.speaker_encoder = SpeakerEncoder()
        self.turn_model = TurnModel()
        self.capacity = Capacity(
            self.config.capacity,
            runner.spec.step_period_seconds,
            runner.spec.full_window_seconds,
            time.monotonic(),
            runner.spec.lanes,
        )
        self.on_step: Callable[[float, int], None] | None = None  # (model seconds, utterances decoded)
        # A step's events, (utterance id, event) in order; called on the engine thread.
        self.on_events: Callable[[list[tuple[str, EngineEvent]]], None] | None = None
        self.num_steps = self.num_tokens = 0
        # False once a fault no single utterance reproduces failed a step: the server stops
        # taking sessions (`/health/ready`), so a balancer moves traffic off.
        self.healthy = True
        self.model_seconds = 0.0  # summed over steps: with steps in flight, overlaps host work
        self._in_flight: deque[tuple[SchedulerOutput, Future[StepResult]]] = deque()
        self._idle = False  # the last step computed nothing new and said nothing
        self._published_consumed: dict[str, int] = {}  # the consumption the listener last heard of
        self._commands: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="voxrt-engine", daemon=True)
        self.snapshot = self._take_stats(time.monotonic())

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._commands.put(None)
        self._thread.join(timeout=30)

    @property
    def spec(self) -> ModelSpec:
        """What the served model is and can do: the edge checks sessions' asks against it."""
        return self.runner.spec

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def add_utterance(
        self,
        utterance_id: str,
        vad: VadConfig | None = None,
        transcription: Transcription = Transcription(),
        kind: RequestKind = RequestKind.LIVE,
    ) -> None:
        """Its turn detection (None: the listener wants no turns; the VAD still runs with the
        engine's settings where the family decodes by turns or speakers are asked), language and
        task (default: the model's choice), and its kind (live speech, or an upload that may
        wait)."""
        self._commands.put(AddUtterance(utterance_id, vad, transcription, kind))

    def add_audio(self, utterance_id: str, samples: np.ndarray, arrived_at: float | None = None) -> None:
        """`arrived_at`: when the audio reached the server (default: now)."""
        self._commands.put(AppendAudio(utterance_id, samples, arrived_at or time.monotonic()))

    def finish_input(self, utterance_id: str) -> None:
        self._commands.put(FinishInput(utterance_id, time.monotonic()))

    def abort(self, utterance_id: str) -> None:
        self._commands.put(Abort(utterance_id))

    def stats(self) -> EngineStats:
        return self.snapshot

    def run_once(self) -> None:
        """One turn of the engine thread's loop on the caller's thread (tests, benchmarks): the
        queued commands, then a step. After a step that did nothing it waits a moment for a
        command, as the thread does: a caller looping on it leaves the GIL to an upload's decode."""
        self._apply_commands(IDLE_SECONDS if self._idle else None)
        self.step()

    def _run(self) -> None:
        try:
            while not self._stopping:
                busy = self._in_flight or any(u.request.wants_step for u in self.utterances.values())
                # A step that did nothing (an upload's window decoding beside): wait a moment
                # for a command rather than spin on the same question.
                wait = (IDLE_SECONDS if self._idle else None) if busy else COMMAND_WAIT_SECONDS
                try:
                    self._apply_commands(wait)
                    self.step()
                except Exception:
                    # Nothing narrowed it to an utterance (a fault of the engine's own): every
                    # utterance may be in a state no step can continue from.
                    log.exception("engine.step_failed")
                    self.healthy = False
                    self._fail_all(list(self.utterances), "the engine failed a step; see the log")
                    self._publish()
        except BaseException:
            log.critical("engine.died", exc_info=True)
            raise

    def _fail_all(self, utterance_ids: list[str], message: str) -> None:
        for utterance_id in utterance_ids:
            if (utterance := self.utterances.get(utterance_id)) is not None:
                self.utterances.fail(utterance, "processing_error", message)

    def _apply_commands(self, wait: float | None) -> None:
        """The queued commands, waiting up to `wait` seconds for the first (None: not at all)."""
        try:
            command = self._commands.get(timeout=wait) if wait is not None else self._commands.get_nowait()
            while True:
                if command is not None:
                    self._apply_walled(command)
                command = self._commands.get_nowait()
        except queue.Empty:
            return

    def _apply_walled(self, command: Command) -> None:
        """A command that raises fails its utterance alone (one that never started is told so)."""
        try:
            self._apply(command)
        except Exception as fault:
            if (utterance := self.utterances.get(command.utterance_id)) is not None:
                self.utterances.failed(utterance, fault)
            else:
                log.error("engine.command_failed", utterance_id=command.utterance_id, exc_info=fault)
                message = f"the utterance could not start ({type(fault).__name__}); see the log"
                self.utterances.emit(command.utterance_id, Failed("processing_error", message))

    def _apply(self, command: Command) -> None:
        if isinstance(command, AddUtterance):
            self.utterances.add(command)
        elif (utterance := self.utterances.get(command.utterance_id)) is None:
            return
        elif isinstance(command, Abort):
            self.utterances.end(utterance)
        elif utterance.request.input_finished:
            return
        elif isinstance(command, AppendAudio):
            self.utterances.append(utterance, command.samples, command.arrived_at)
        else:
            self.utterances.finish_input(utterance, command.arrived_at)

    def step(self) -> None:
        """Schedule and submit a step; complete the oldest once the runner's pipeline is full.

        With two steps in flight the host schedules step N+1 and hands out step N-1's
        text while the device runs step N.
        """
        self.utterances.detect_turns(self.vad, self.speaker_encoder, self.turn_model)
        out = self.scheduler.schedule()
        if out.scheduled:
            self._submit(out)
        while self._in_flight and (
            len(self._in_flight) >= self.runner.spec.max_steps_in_flight or not out.scheduled
        ):
            self._complete(*self._in_flight.popleft())
        self.snapshot = self._take_stats(time.monotonic())
        self._publish()

    def _submit(self, out: SchedulerOutput) -> None:
        """Launch the step; where preparing it raises, each utterance's part is launched alone
        (one utterance's step is its part), and a part that raises fails its utterance."""
        parts = [out]
        while parts:
            part = parts.pop()
            try:
                self._in_flight.append((part, self.runner.submit(part, self._states(part))))
            except Exception as fault:
                if len(part.scheduled) > 1:
                    log.warning("engine.submit_failed", utterances=len(part.scheduled), exc_info=True)
                    parts = part.by_request()[::-1]
                    continue
                self._discard_outputs(part)
                self.utterances.failed(self.utterances[part.scheduled[0].request.request_id], fault)

    def _discard_outputs(self, out: SchedulerOutput) -> None:
        """Outputs a step should have produced do not exist: no later hit may find them."""
        for _, item in out.encoder_inputs:
            self.scheduler.encoder_cache.discard(item.mm_hash)

    def _states(self, out: SchedulerOutput) -> dict[str, object]:
        return {s.request.request_id: self.utterances[s.request.request_id].state for s in out.scheduled}

    def _take_stats(self, now: float) -> EngineStats:
        """The snapshot other threads read: consistent, and free to read."""
        cache, features, capacity = self.scheduler.encoder_cache, self.feature_cache, self.capacity
        return EngineStats(
            utterances=len(self.utterances),
            encoder_cache_rows=cache.num_referenced_rows,
            encoder_cache_resident_rows=cache.num_used_rows,
            encoder_cache_capacity=cache.capacity_rows,
            feature_cache_queries=features.queries,
            feature_cache_hits=features.hits,
            feature_cache_bytes=features.num_bytes,
            steps=self.num_steps,
            tokens=self.num_tokens,
            kv_slots_used=self.runner.num_slots_in_use,
            vad_calls=self.vad.calls,
            turn_model_calls=self.turn_model.calls,
            busy_share=capacity.busy_share(now),
            capacity_sessions=capacity.sessions(self.config.capacity.target_busy),
            shed_to_sessions=capacity.sessions(self.config.capacity.shed_to_busy),
            session_step_seconds=capacity.session_step_seconds,
        )

    def _publish(self) -> None:
        """The audio each utterance has consumed where it moved, then the events since the last
        publish, to the listener, if there are any; one that raises loses them, never the
        engine thread."""
        consumed = self.utterances.consumed_samples()
        events: list[tuple[str, EngineEvent]] = [
            (utterance_id, AudioConsumed(samples))
            for utterance_id, samples in consumed.items()
            if samples != self._published_consumed.get(utterance_id, 0)
        ]
        self._published_consumed = consumed
        events += self.utterances.outbox
        self.utterances.outbox = []
        if events and self.on_events is not None:
            try:
                self.on_events(events)
            except Exception:
                log.exception("engine.listener_failed", events=len(events))

    def _complete(self, out: SchedulerOutput, future: Future[StepResult]) -> None:
        try:
            result = future.result()
        except Exception:
            self._discard_outputs(out)
            # The runner narrows a fault to the utterances that cause it; one it could not
            # narrow fails the step's utterances, and the engine is no longer ready for more.
            log.exception("engine.step_fault", utterances=len(out.scheduled))
            self.healthy = False
            self._fail_all([s.request.request_id for s in out.scheduled], "a step failed; see the log")
            return
        for request_id, fault in result.failed.items():
            if (utterance := self.utterances.get(request_id)) is not None:
                self.utterances.failed(utterance, fault)
        self.num_steps += 1
        self.model_seconds += result.model_seconds
        outputs = [(rid, output) for rid, outs in result.outputs.items() for output in outs]
        # Capacity is what live speech costs: uploads decode on a lane of their own beside it.
        windows = [
            output.window_seconds
            for rid, output in outputs
            if (
                output.num_tokens
                and (u := self.utterances.get(rid)) is not None
                and u.request.kind is RequestKind.LIVE
            )
        ]
        self.capacity.record(time.monotonic(), result.model_seconds, windows)
        if result.model_seconds > self.config.capacity.max_lag_seconds / 2:
            # One such step takes every session halfway to the lag that refuses newcomers: what
            # it decoded is what a stall is read from (a window's tokens show a loop).
            log.warning(
                "engine.slow_step",
                model_seconds=round(result.model_seconds, 3),
                utterances=len(out.scheduled),
                decodes=[
                    (rid[-8:], round(output.window_seconds, 1), output.num_tokens, bool(output.turn_ended))
                    for rid, output in outputs
                    if output.num_tokens
                ],
            )
        if self.on_step is not None:
            self.on_step(result.model_seconds, len(windows))
        updates = {rid: output.update for rid, output in outputs if output.update is not None}
        sampled = {
            rid: [t for output in outs for t in output.token_ids]
            for rid, outs in result.outputs.items()
            if any(output.token_ids for output in outs)
        }
        self.scheduler.update_from_output(updates, sampled)
        self.num_tokens += self.utterances.deliver_step(result.outputs)
        self._idle = not out.num_positions and not result.failed and not self.utterances.outbox
