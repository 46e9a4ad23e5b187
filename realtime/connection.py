"""One WebSocket connection: its wire session, its utterances in the engine, its bounded outbox.

The wire session (vLLM's or OpenAI's protocol, `realtime/protocols/`) turns client events
into calls here and engine events into server events; this class owns what both share.
"""

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import structlog
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from realtime.engine import Engine
from realtime.events import Delta, Done, EngineEvent, Failed
from realtime.metrics import Metrics
from voxtral.audio import SAMPLE_RATE
from voxtral.vad import VadConfig


@dataclass
class ConnectionLimits:
    outbox_events: int = 256
    served_model: str = ""
    model_names: frozenset[str] = frozenset()  # names a client may ask for the served model by
    strict_model: bool = False  # refuse a model name voxrt does not serve (vLLM accepts any)


class WireSession(Protocol):
    def opened(self) -> None:
        """Send the protocol's greeting."""

    def handle(self, message: str | bytes) -> None:
        """One client event."""

    def on_event(self, utterance_id: str, event: EngineEvent) -> None:
        """One engine event of an utterance this session started."""


class Connection:
    """Server events go through a bounded outbox: a client that stops reading fills it and
    is closed with `slow_consumer`, so memory does not grow."""

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
        self.wire: WireSession | None = None
        self.utterances: set[str] = set()  # started, not yet done or failed
        self.first_audio_at: dict[str, float] = {}  # utterances still waiting for their first delta
        self.num_utterances = 0
        self.idle = asyncio.Event()  # no utterance in the engine
        self.idle.set()
        self.started_at = time.monotonic()
        self.audio_seconds = 0.0
        self.num_deltas = 0
        self.num_errors = 0
        self.closing: asyncio.Future | None = None

    async def run(self, wire: WireSession) -> None:
        self.wire = wire  # a vLLM session may hand over to an OpenAI one on the first event
        sender = asyncio.create_task(self._send_loop())
        wire.opened()
        self.log.info(
            "connection.open", remote=str(self.websocket.remote_address), protocol=type(wire).__name__
        )
        try:
            async for message in self.websocket:
                self.wire.handle(message)
        except ConnectionClosed:
            pass
        finally:
            for utterance in list(self.utterances):
                self.abort(utterance)
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
            self.count_error("slow_consumer", "client is not reading events")
            self.log.warning("connection.slow_consumer", outbox=self.outbox.qsize())
            for utterance in list(self.utterances):
                self.abort(utterance)
            # The close frame may never reach a client that does not read: websockets
            # then drops the TCP connection after its close timeout.
            self.closing = asyncio.ensure_future(
                self.websocket.close(1008, "slow_consumer: client is not reading events")
            )

    def count_error(self, code: str, message: str) -> None:
        """An error event the wire session sends (or a close): counted and logged."""
        self.num_errors += 1
        self.metrics.errors.labels(code=code).inc()
        self.log.info("connection.client_error", code=code, error=message)

    def start_utterance(self, vad: VadConfig | None = None) -> str:
        self.num_utterances += 1
        utterance = f"{self.connection_id}-{self.num_utterances}"
        self.utterances.add(utterance)
        self.idle.clear()
        self.metrics.utterances_total.inc()
        self.metrics.utterances_active.inc()
        self.engine.add_utterance(
            utterance, lambda e: self.loop.call_soon_threadsafe(self._on_engine_event, utterance, e), vad
        )
        return utterance

    def add_audio(self, utterance: str, samples: np.ndarray) -> None:
        if not len(samples):
            return
        self.first_audio_at.setdefault(utterance, time.monotonic())
        seconds = len(samples) / SAMPLE_RATE
        self.audio_seconds += seconds
        self.metrics.audio_seconds.inc(seconds)
        self.engine.add_audio(utterance, samples)

    def finish(self, utterance: str) -> None:
        self.engine.finish_input(utterance)

    def finish_all(self) -> None:
        """The server drains: every utterance's input ends here."""
        for utterance in self.utterances:
            self.finish(utterance)

    def abort(self, utterance: str) -> None:
        if utterance in self.utterances:
            self.engine.abort(utterance)
            self._ended(utterance)

    def _on_engine_event(self, utterance: str, event: EngineEvent) -> None:
        if utterance not in self.utterances:
            return  # aborted meanwhile
        if isinstance(event, Delta):
            self.num_deltas += 1
            self.metrics.deltas.inc()
            self.metrics.delta_latency_seconds.observe(event.latency)
            if (first_audio_at := self.first_audio_at.pop(utterance, None)) is not None:
                self.metrics.first_delta_seconds.observe(time.monotonic() - first_audio_at)
        elif isinstance(event, Failed):
            self.count_error(event.code, event.message)
        if isinstance(event, Done | Failed):
            self._ended(utterance)
        self.wire.on_event(utterance, event)

    def _ended(self, utterance: str) -> None:
        self.utterances.discard(utterance)
        self.first_audio_at.pop(utterance, None)
        self.metrics.utterances_active.dec()
        if not self.utterances:
            self.idle.set()
