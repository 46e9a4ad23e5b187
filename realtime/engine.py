"""The step loop: one thread owns the scheduler, the caches and the runner.

The asyncio side talks to it only through `submit`-style calls that enqueue
commands, and hears back through each session's `on_event` callback, which the
engine calls from its own thread (the server hops it back onto the event loop).
Model compute therefore never blocks the event loop.
"""

import asyncio
import hashlib
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import structlog

from cache import FeatureCache
from scheduler import AudioItem, PlaceholderRange, Request, RequestStatus, Scheduler, SchedulerOutput
from voxtral.audio import RIGHT_CONTEXT, SAMPLE_RATE
from voxtral.runner import ModelRunner, StepResult, StreamState

log = structlog.get_logger(__name__)

MAX_ITEMS_PER_SESSION = 32_768


@dataclass
class Delta:
    text: str
    latency: float  # seconds since the newest audio the step read arrived


@dataclass
class Done:
    text: str
    audio_seconds: float
    num_tokens: int


@dataclass
class Failed:
    code: str
    message: str


EngineEvent = Delta | Done | Failed


@dataclass
class EngineConfig:
    max_sessions: int = 64
    max_session_seconds: float = 4 * 3600.0
    feature_cache_bytes: int = 64 << 20


@dataclass
class EngineStats:
    active_sessions: int
    encoder_cache_rows: int  # referenced by live sessions: zero once all have ended
    encoder_cache_resident_rows: int  # referenced or kept, unreferenced, for reuse
    encoder_cache_capacity: int
    encoder_cache_entries: int
    feature_cache_queries: int
    feature_cache_hits: int
    feature_cache_bytes: int
    steps: int
    tokens: int
    kv_slots_used: int  # sessions holding per-session device state


@dataclass
class _Session:
    stream: StreamState
    on_event: Callable[[EngineEvent], None]
    num_tokens: int = 0
    num_client_samples: int = 0  # audio the client sent, without the family's padding
    last_item_at: float = field(default_factory=time.monotonic)


async def _until_ended(inbox: asyncio.Queue[EngineEvent]) -> AsyncIterator[EngineEvent]:
    while True:
        event = await inbox.get()
        yield event
        if not isinstance(event, Delta):
            return


class Engine:
    def __init__(
        self,
        runner: ModelRunner,
        config: EngineConfig | None = None,
        on_step: Callable[[float, int], None] | None = None,
        leak_on_free: bool = False,
    ) -> None:
        self.runner = runner
        self.config = config or EngineConfig()
        self.scheduler = Scheduler(runner.scheduler_config(self.config.max_sessions))
        self.feature_cache = FeatureCache(self.config.feature_cache_bytes)
        self.sessions: dict[str, _Session] = {}
        self.on_step = on_step
        # Test-only: skip freeing a finished session's cache entries, so a soak run
        # can be shown to catch a leak.
        self.leak_on_free = leak_on_free
        self.num_steps = 0
        self.num_tokens = 0
        self.model_seconds = 0.0  # summed over steps: with steps in flight, overlaps host work
        self._in_flight: deque[tuple[SchedulerOutput, Future[StepResult]]] = deque()
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="voxrt-engine", daemon=True)

    # ---- called from any thread ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        self._thread.join(timeout=30)

    def add_session(self, session_id: str, on_event: Callable[[EngineEvent], None]) -> None:
        self._commands.put(("add", session_id, on_event))

    def events(self, session_id: str) -> AsyncIterator[EngineEvent]:
        """Add a session now; iterate its events as they happen, ending with `Done` or `Failed`.

        Call from a running event loop: the engine thread hands each event over to it.
        Feed the session with `add_audio` / `finish_input`, stop it with `abort`.
        """
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self.add_session(session_id, lambda event: loop.call_soon_threadsafe(inbox.put_nowait, event))
        return _until_ended(inbox)

    def add_audio(self, session_id: str, samples: np.ndarray) -> None:
        self._commands.put(("audio", session_id, samples))

    def finish_input(self, session_id: str) -> None:
        self._commands.put(("finish", session_id))

    def abort(self, session_id: str) -> None:
        self._commands.put(("abort", session_id))

    def stats(self) -> EngineStats:
        cache = self.scheduler.encoder_cache
        return EngineStats(
            active_sessions=len(self.sessions),
            encoder_cache_rows=cache.capacity_rows - cache.num_freeable_rows,
            encoder_cache_resident_rows=cache.num_used_rows,
            encoder_cache_capacity=cache.capacity_rows,
            encoder_cache_entries=len(cache.refs),
            feature_cache_queries=self.feature_cache.queries,
            feature_cache_hits=self.feature_cache.hits,
            feature_cache_bytes=self.feature_cache.num_bytes,
            steps=self.num_steps,
            tokens=self.num_tokens,
            kv_slots_used=self.runner.num_slots_in_use,
        )

    # ---- the engine thread -----------------------------------------------------------------

    def run_once(self) -> None:
        """Apply queued commands and run one step, on the caller's thread (tests, benchmarks)."""
        self._drain_commands(block=False)
        self.step()

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = self._in_flight or any(s.stream.request.num_pending > 0 for s in self.sessions.values())
            try:
                self._drain_commands(block=not busy)
                self.step()
            except Exception:
                log.exception("engine.step_failed")
                self._fail_all("processing_error", "the engine failed a step; see the server log")

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: tuple) -> None:
        kind, *args = command
        if kind == "add":
            session_id, on_event = args
            if session_id in self.sessions:
                on_event(Failed("invalid_event", f"session {session_id!r} already exists"))
                return
            request = Request(session_id)
            try:
                stream = self.runner.new_stream(request)
            except RuntimeError as exc:
                on_event(Failed("too_many_sessions", str(exc)))
                return
            self.scheduler.add_request(request)
            session = _Session(stream, on_event)
            self.sessions[session_id] = session
            self._chunk(session, np.zeros(self.runner.leading_silence_samples, np.float32))
        elif kind == "audio":
            self._append_audio(*args)
        elif kind == "finish":
            session = self.sessions.get(args[0])
            if session is not None and not session.stream.request.input_finished:
                stream = session.stream
                padding = self.runner.trailing_silence_samples(stream.num_samples + stream.num_buffered)
                if self._chunk(session, np.zeros(padding, np.float32)):
                    self._flush(session)
        elif kind == "abort":
            self._end(args[0], RequestStatus.ABORTED)

    def _append_audio(self, session_id: str, samples: np.ndarray) -> None:
        session = self.sessions.get(session_id)
        if session is None or session.stream.request.input_finished:
            return
        session.num_client_samples += len(samples)
        if session.num_client_samples / SAMPLE_RATE > self.config.max_session_seconds:
            self._fail(
                session_id, "session_too_long", f"session exceeds {self.config.max_session_seconds:g} s"
            )
            return
        self._chunk(session, samples)

    def _chunk(self, session: _Session, samples: np.ndarray) -> bool:
        """Buffer samples and cut every whole item out of the buffer; False if the session failed."""
        stream = session.stream
        stream.buffer.append(samples)
        stream.num_buffered += len(samples)
        # An item takes its chunk plus the few samples its last frame looks ahead at.
        while stream.num_buffered >= self.runner.chunk_samples + RIGHT_CONTEXT:
            pending = np.concatenate(stream.buffer)
            chunk = pending[: self.runner.chunk_samples]
            right = pending[self.runner.chunk_samples : self.runner.chunk_samples + RIGHT_CONTEXT]
            stream.buffer = [pending[self.runner.chunk_samples :]]
            stream.num_buffered = len(stream.buffer[0])
            if not self._add_item(stream.request.request_id, session, chunk, right):
                return False
        return True

    def _flush(self, session: _Session) -> None:
        """The final item: what is buffered, or a few samples of silence so a final step runs."""
        stream = session.stream
        pending = np.concatenate(stream.buffer) if stream.buffer else np.zeros(0, np.float32)
        hop = self.runner.samples_per_position
        size = max(hop, -(-len(pending) // hop) * hop)
        chunk = np.zeros(size, np.float32)
        chunk[: len(pending)] = pending
        stream.buffer, stream.num_buffered = [], 0
        if self._add_item(stream.request.request_id, session, chunk, np.zeros(0, np.float32)):
            stream.request.input_finished = True

    def _add_item(self, session_id: str, session: _Session, chunk: np.ndarray, right: np.ndarray) -> bool:
        stream = session.stream
        request = stream.request
        if len(request.items) >= MAX_ITEMS_PER_SESSION:
            self._fail(session_id, "session_too_long", f"session exceeds {MAX_ITEMS_PER_SESSION} audio items")
            return False
        left = stream.left_context
        digest = hashlib.blake2b(digest_size=16)
        for part in (left, chunk, right):
            digest.update(part.tobytes())
        content_hash = digest.hexdigest()
        features = self.feature_cache.get_or_compute(
            content_hash, lambda: self.runner.item_features(chunk, left, right)
        )
        mm_hash = content_hash
        if self.runner.history_dependent_items:
            # Same audio, different past, different encoder output: never shared.
            mm_hash = f"{session_id}#{len(request.items)}:{content_hash}"
        spp = self.runner.samples_per_position
        placeholder = PlaceholderRange(stream.num_samples // spp, len(chunk) // spp)
        request.add_item(AudioItem(placeholder, mm_hash, features))
        session.last_item_at = time.monotonic()
        stream.num_samples += len(chunk)
        stream.left_context = chunk[-400:].copy()
        return True

    def step(self) -> None:
        """Schedule and submit a step; complete the oldest one once the runner's pipeline is full.

        With two steps in flight the host schedules step N+1 and hands out step N-1's
        text while the device runs step N.
        """
        out = self.scheduler.schedule()
        if out.scheduled:
            streams = {
                s.request.request_id: self.sessions[s.request.request_id].stream for s in out.scheduled
            }
            self._in_flight.append((out, self.runner.submit(out, streams)))
        while self._in_flight and (
            len(self._in_flight) >= self.runner.max_steps_in_flight or not out.scheduled
        ):
            self._complete(*self._in_flight.popleft())

    def _complete(self, out: SchedulerOutput, future: Future[StepResult]) -> None:
        try:
            result = future.result()
        except Exception:
            # Outputs this step should have produced do not exist: no later hit may find them.
            for request, input_id in out.encoder_inputs:
                self.scheduler.encoder_cache.discard(request.items[input_id].mm_hash)
            raise
        self.num_steps += 1
        self.model_seconds += result.model_seconds
        if self.on_step is not None:
            self.on_step(result.model_seconds, len(out.scheduled))
        for scheduled in out.scheduled:
            if scheduled.request.request_id in self.sessions:
                self._drop_released_features(scheduled.request)
        for session_id, tokens in result.sampled.items():
            if session_id in self.sessions:
                self.sessions[session_id].stream.request.resolve(tokens)
        for session_id, num_tokens in result.num_tokens.items():
            self.num_tokens += num_tokens
            if session_id in self.sessions:
                self.sessions[session_id].num_tokens += num_tokens
        for session_id, text in result.deltas.items():
            session = self.sessions.get(session_id)
            if session is not None:
                session.stream.text += text
                session.on_event(Delta(text, time.monotonic() - session.last_item_at))
        for session_id in result.finished:
            session = self.sessions.get(session_id)
            if session is not None:
                seconds = session.num_client_samples / SAMPLE_RATE
                session.on_event(Done(session.stream.text, seconds, session.num_tokens))
                self._end(session_id, RequestStatus.FINISHED)

    def _drop_released_features(self, request: Request) -> None:
        """Items the family no longer reads keep no features: memory stays flat over hours."""
        stream = self.sessions[request.request_id].stream
        release = request.release_position
        i = stream.num_items_released
        while i < len(request.items) and request.items[i].end <= release:
            request.items[i].features = None
            i += 1
        stream.num_items_released = i

    def _fail(self, session_id: str, code: str, message: str) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.on_event(Failed(code, message))
            self._end(session_id, RequestStatus.ABORTED)

    def _fail_all(self, code: str, message: str) -> None:
        for session_id in list(self.sessions):
            self._fail(session_id, code, message)

    def _end(self, session_id: str, status: RequestStatus) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        if self.leak_on_free:
            self.scheduler.requests.pop(session_id, None)
        else:
            self.scheduler.finish_request(session_id, status)
        self.runner.release(session.stream)
        session.stream.request.drop_placeholders()
        for item in session.stream.request.items:
            item.features = None
