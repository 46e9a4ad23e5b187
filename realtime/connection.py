"""One WebSocket connection: its events, its utterances in the engine, its bounded outbox."""

import asyncio
import time
from dataclasses import dataclass

import structlog
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from realtime.engine import Engine
from realtime.events import Delta, Done, EngineEvent, Failed, Interim, SpeechStarted, SpeechStopped
from realtime.metrics import Metrics
from realtime.protocols import vllm as protocol
from realtime.protocols.vllm import AudioAppend, Commit, ProtocolError, SessionUpdate
from voxtral.audio import SAMPLE_RATE


@dataclass
class ConnectionLimits:
    outbox_events: int = 256
    model_names: frozenset[str] = frozenset()


class Connection:
    """Audio before any commit starts an utterance (documented); `final` ends its input.

    After `transcription.done` the next commit or audio starts a new utterance on the
    same connection. Server events go through a bounded outbox: a client that stops
    reading fills it and is closed with `slow_consumer`, so memory does not grow.
    """

    def __init__(
        self,
        websocket: ServerConnection,
        engine: Engine,
        metrics: Metrics,
        limits: ConnectionLimits,
        connection_id: str,
    ) -> None:
        self.websocket = websocket
        self.engine = engine
        self.metrics = metrics
        self.limits = limits
        self.connection_id = connection_id
        self.log = structlog.get_logger("voxrt.connection").bind(connection_id=connection_id)
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue(maxsize=limits.outbox_events)
        self.loop = asyncio.get_running_loop()
        self.utterance: str | None = None  # engine id of the running utterance
        self.finishing = False
        self.interim = False  # the client asked for `transcription.interim`
        self.num_utterances = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.started_at = time.monotonic()
        self.first_audio_at: float | None = None
        self.got_first_delta = False
        self.audio_seconds = 0.0
        self.num_deltas = 0
        self.num_errors = 0
        self.closing: asyncio.Future | None = None

    async def run(self, created_event: str) -> None:
        sender = asyncio.create_task(self._send_loop())
        self.send(created_event)
        self.log.info("connection.open", remote=str(self.websocket.remote_address))
        try:
            async for message in self.websocket:
                self.handle(message)
        except ConnectionClosed:
            pass
        finally:
            self.abort_utterance()
            sender.cancel()
            self.log.info(
                "connection.close",
                seconds=round(time.monotonic() - self.started_at, 3),
                audio_seconds=round(self.audio_seconds, 3),
                utterances=self.num_utterances,
                deltas=self.num_deltas,
                errors=self.num_errors,
                close_code=self.websocket.close_code,
            )

    async def _send_loop(self) -> None:
        try:
            while (text := await self.outbox.get()) is not None:
                await self.websocket.send(text)
        except ConnectionClosed:
            pass

    def send(self, text: str) -> None:
        if self.closing is not None:
            return
        try:
            self.outbox.put_nowait(text)
        except asyncio.QueueFull:
            self.metrics.errors.labels(code="slow_consumer").inc()
            self.log.warning("connection.slow_consumer", outbox=self.outbox.qsize())
            self.abort_utterance()
            # The close frame may never reach a client that does not read: websockets
            # then drops the TCP connection after its close timeout.
            self.closing = asyncio.ensure_future(
                self.websocket.close(1008, "slow_consumer: client is not reading events")
            )

    def send_error(self, code: str, message: str) -> None:
        self.num_errors += 1
        self.metrics.errors.labels(code=code).inc()
        self.log.info("connection.client_error", code=code, error=message)
        self.send(protocol.error(code, message))

    def handle(self, message: str | bytes) -> None:
        try:
            event = protocol.parse_client_event(message)
            if isinstance(event, SessionUpdate):
                if event.model is not None and event.model not in self.limits.model_names:
                    raise ProtocolError("unknown_model", f"unknown model {event.model!r}")
                if event.interim is not None:
                    self.interim = event.interim
            elif isinstance(event, AudioAppend):
                if self.finishing:
                    raise ProtocolError("input_finished", "audio after the final commit: wait for done")
                self._start_if_idle()
                if len(event.samples):
                    self.first_audio_at = self.first_audio_at or time.monotonic()
                    seconds = len(event.samples) / SAMPLE_RATE
                    self.audio_seconds += seconds
                    self.metrics.audio_seconds.inc(seconds)
                    self.engine.add_audio(self.utterance, event.samples)
            elif isinstance(event, Commit):
                if self.finishing:
                    raise ProtocolError("input_finished", "input already finished: wait for done")
                self._start_if_idle()
                if event.final:
                    self.finish_input()
        except ProtocolError as exc:
            self.send_error(exc.code, exc.message)

    def _start_if_idle(self) -> None:
        if self.utterance is not None:
            return
        self.num_utterances += 1
        self.utterance = f"{self.connection_id}-{self.num_utterances}"
        self.idle.clear()
        self.first_audio_at, self.got_first_delta = None, False
        self.metrics.utterances_total.inc()
        self.metrics.utterances_active.inc()
        utterance = self.utterance
        self.engine.add_utterance(
            utterance, lambda e: self.loop.call_soon_threadsafe(self._on_engine_event, utterance, e)
        )

    def finish_input(self) -> None:
        if self.utterance is not None and not self.finishing:
            self.finishing = True
            self.engine.finish_input(self.utterance)

    def _on_engine_event(self, utterance: str, event: EngineEvent) -> None:
        if utterance != self.utterance or isinstance(event, SpeechStarted | SpeechStopped):
            return  # vLLM's wire has no turn events
        if isinstance(event, Interim):
            if self.interim:
                self.send(protocol.transcription_interim(event.text))
            return
        if isinstance(event, Delta):
            self.num_deltas += 1
            self.metrics.deltas.inc()
            self.metrics.delta_latency_seconds.observe(event.latency)
            if not self.got_first_delta and self.first_audio_at is not None:
                self.got_first_delta = True
                self.metrics.first_delta_seconds.observe(time.monotonic() - self.first_audio_at)
            self.send(protocol.transcription_delta(event.text))
            return
        if isinstance(event, Done):
            self.send(protocol.transcription_done(event.text, event.audio_seconds, event.num_tokens))
        elif isinstance(event, Failed):
            self.send_error(event.code, event.message)
        self._utterance_ended()

    def _utterance_ended(self) -> None:
        self.utterance = None
        self.finishing = False
        self.metrics.utterances_active.dec()
        self.idle.set()

    def abort_utterance(self) -> None:
        if self.utterance is not None:
            self.engine.abort(self.utterance)
            self._utterance_ended()
