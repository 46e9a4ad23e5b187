"""One WebSocket connection: its wire session, its utterances in the engine, its bounded outbox.

The wire session (vLLM's, OpenAI's or Deepgram's protocol, `realtime/protocols/`) turns client
events into commands on the utterances it starts here, and engine events into server events;
this class owns what they share: the socket and its limits; its utterances' seats are its
`Seats`.
"""

import asyncio
import time
from collections.abc import Callable

import structlog
from starlette.websockets import WebSocket

from realtime.config import ServedModel
from realtime.engine.events import Delta, Done, EngineEvent, Failed
from realtime.engine.loop import Engine
from realtime.handles import Handles, UtteranceHandle
from realtime.limits import ConnectionLimits, EventRate
from realtime.metrics import Metrics
from realtime.outbox import Outbox
from realtime.progress import EngineProgress
from realtime.protocols.openai import OpenAISession
from realtime.protocols.openai_wire import is_openai_event
from realtime.protocols.port import IdleClose, WireSession
from realtime.protocols.vllm import VllmSession
from realtime.reader import MessageReader
from realtime.seats import Seats
from voxtral.audio import SAMPLE_RATE
from voxtral.runner import ModelSpec, Transcription
from voxtral.vad import VadConfig

RECV_WAITED_SECONDS = 0.01  # a read that took this long found no event already waiting
CLOSE_SECONDS = 2.0  # how long a close waits for the queued events and the peer's close frame


class Connection:
    """What one client can hold is bounded: server events go through a bounded outbox (a
    client that stops reading is closed with `slow_consumer`); audio the engine has not
    consumed yet, by pausing the socket's reads (TCP backpressure); events per second, by
    a bucket (`rate_limited`); and time without events, by `idle_timeout`."""

    def __init__(
        self,
        websocket: WebSocket,
        engine: Engine,
        metrics: Metrics,
        limits: ConnectionLimits,
        model: ServedModel,
        handles: Handles,
        progress: EngineProgress,
        connection_id: str,
    ) -> None:
        """`handles`: the server's table of utterances and where their events go; `progress`:
        woken as the engine consumes audio."""
        self.websocket, self.engine, self.metrics, self.limits = websocket, engine, metrics, limits
        self.model, self.progress = model, progress
        self.connection_id = connection_id
        self.log = structlog.get_logger("voxrt.connection").bind(connection_id=connection_id)
        self.outbox = Outbox(websocket, limits.outbox_events, self._send_failed)
        self.wire: WireSession | None = None
        self.seats = Seats(connection_id, limits.max_utterances, handles, metrics, progress)
        self.draining = False  # the server ended every input: audio still coming is not the client's fault
        self.read_all_at = time.monotonic()  # when a read last found nothing waiting in TCP
        self.rate = EventRate(limits.max_events_per_second)
        self.num_events = 0  # client events handled
        self.started_at = time.monotonic()
        self.num_deltas = 0
        self.num_errors = 0
        self.closing: asyncio.Future | None = None
        self.reader = MessageReader(websocket)
        self.close_code: int | None = None  # sent or received

    async def run(self, make_wire: Callable[["Connection"], WireSession]) -> None:
        """Serve the client until either side closes, in the protocol its URL chose (or, from
        vLLM's, its first event)."""
        wire = self.wire = make_wire(self)
        self.outbox.start(self.log)
        wire.opened()
        self.log.info("connection.open", remote=str(self.websocket.client), protocol=type(wire).__name__)
        try:
            while self.closing is None:
                idle = self.wire.idle or IdleClose(
                    self.limits.idle_seconds,
                    1000,
                    "idle_timeout",
                    f"no event for {self.limits.idle_seconds:g} s",
                )
                try:
                    asked_at = time.monotonic()
                    async with asyncio.timeout(idle.seconds):
                        message = await self.reader.receive()
                    if time.monotonic() - asked_at > RECV_WAITED_SECONDS:
                        self.read_all_at = asked_at
                except TimeoutError:
                    if not self.seats.finishing:
                        await self.close(idle.code, idle.reason, idle.message)
                    continue
                if message is None:
                    self.close_code = self.close_code or self.reader.disconnect_code
                    break
                # recv() returns without suspending while frames are buffered: yield once per
                # event, or a flooding client holds the event loop for hundreds of events.
                await asyncio.sleep(0)
                if self.closing is not None:  # closed meanwhile: what is still read goes unheard
                    break
                if self.rate.allow():
                    try:
                        self._handle(message)
                    except Exception:  # a fault of ours: this connection ends with a reason
                        self.log.exception("connection.event_failed")
                        await self.close(1011, "internal_error", "the server failed this connection's event")
                        continue
                    await self._backpressure()
                elif self.rate.dropped > self.limits.max_events_per_second:
                    await self.close(1008, "rate_limited", "events kept coming faster than allowed")
                elif self.rate.dropped == 1:
                    rate = f"{self.limits.max_events_per_second:g}"
                    self.send_error("rate_limited", f"over {rate} events per second: events dropped")
            # Closed by the server (from here, or shed from outside): the close frame with its
            # reason goes before the handler returns.
            if self.closing is not None:
                await self.closing
        finally:
            self.seats.abort_all()
            self.outbox.stop()
            self.reader.stop()
            self.log.info(
                "connection.close",
                seconds=round(time.monotonic() - self.started_at, 3),
                audio_seconds=round(self.seats.audio_seconds, 3),
                utterances=self.seats.num_started,
                deltas=self.num_deltas,
                errors=self.num_errors,
                close_code=self.close_code,
            )

    def _handle(self, message: str | bytes) -> None:
        if not self.num_events and isinstance(self.wire, VllmSession) and is_openai_event(message):
            # An OpenAI client on a URL that did not say so: its first event picks the protocol.
            self.wire = OpenAISession(self)
        self.num_events += 1
        self.wire.handle(message)

    @property
    def spec(self) -> ModelSpec:
        """The served model's facts: what a session may ask of it."""
        return self.engine.spec

    def _send_failed(self) -> None:
        self.metrics.closes.labels(reason="internal_error").inc()
        self.end(1011, "internal_error")

    async def close(self, code: int, reason: str, message: str) -> None:
        """An error event saying why, the events queued before it, then the close frame."""
        self.metrics.closes.labels(reason=reason).inc()
        self.send_error(reason, message)
        await asyncio.shield(self.end(code, reason, after_outbox=True))

    def end(self, code: int, reason: str, after_outbox: bool = False) -> asyncio.Future:
        """The one way a connection closes, once: its utterances leave the engine at once (a
        shed session's capacity is what shedding is for), then the close frame goes, after
        the events queued where `after_outbox` (a client that reads nothing takes none)."""
        if self.closing is None:
            self.closing = asyncio.ensure_future(self._close(code, reason, after_outbox))
        self.seats.abort_all()
        return self.closing

    async def _close(self, code: int, reason: str, after_outbox: bool) -> None:
        """The close frame, after the queued events where asked. Each waits at most
        `CLOSE_SECONDS`: a sender that died, or a peer that stopped reading, must not hold the
        close, and a peer that reads nothing is dropped by the kernel (the listening socket's
        `TCP_USER_TIMEOUT`)."""
        if after_outbox:
            await self.outbox.flush(CLOSE_SECONDS)
        self.close_code = self.close_code or code
        try:
            async with asyncio.timeout(CLOSE_SECONDS):
                await self.websocket.close(code, reason)
        except Exception:  # gone, or closed already: nothing more to say to it
            self.log.info("connection.close_frame_not_sent", code=code)

    async def _backpressure(self) -> None:
        """Read no further while the engine has more than `max_buffered_seconds` of this
        connection's audio to consume: the client's sends then wait on TCP. A client
        that disconnects meanwhile, or a close, ends the wait."""
        limit = self.limits.max_buffered_seconds * SAMPLE_RATE
        while (
            self.seats
            and self.closing is None
            and not self.reader.gone()
            and self.seats.unconsumed_samples() > limit
        ):
            waits = [asyncio.ensure_future(self.progress.wait())]
            if self.reader.may_read_ahead():
                waits.append(asyncio.ensure_future(self.reader.read()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()  # a read left waiting is taken by the next (`MessageReader.read`)

    def send(self, text: str) -> None:
        if self.closing is not None:
            return
        if not self.outbox.put(text):
            self.count_error("slow_consumer", "client is not reading events")
            self.metrics.closes.labels(reason="slow_consumer").inc()
            self.log.warning("connection.slow_consumer", events_unsent=self.outbox.events)
            self.end(1008, "slow_consumer: client is not reading events")

    def send_error(self, code: str, message: str) -> None:
        """An error event in the wire protocol's shape, counted."""
        self.count_error(code, message)
        self.send(self.wire.error_event(code, message))

    def count_error(self, code: str, message: str) -> None:
        """An error event the wire session sends (or a close): counted and logged."""
        self.num_errors += 1
        self.metrics.errors.labels(code=code).inc()
        self.log.info("connection.client_error", code=code, error=message)

    def start_utterance(
        self, vad: VadConfig | None = None, transcription: Transcription = Transcription()
    ) -> UtteranceHandle:
        return self.seats.start(self, vad, transcription, read_all_at=self._read_all_at)

    def _read_all_at(self) -> float:
        return self.read_all_at

    def finish_all(self) -> None:
        """The server drains: every utterance's input ends here."""
        self.draining = True
        self.seats.finish_all()

    def abort(self, utterance: str) -> None:
        self.seats.abort(utterance)

    def on_engine_event(self, utterance: str, event: EngineEvent) -> None:
        live = self.seats.get(utterance)
        if isinstance(event, Delta):
            self.num_deltas += 1
            self.metrics.deltas.inc()
            self.metrics.delta_latency_seconds.observe(event.latency)
            if live is not None and not live.delta_sent and live.audio_started_at is not None:
                live.delta_sent = True
                self.metrics.first_delta_seconds.observe(time.monotonic() - live.audio_started_at)
        elif isinstance(event, Failed):
            self.count_error(event.code, event.message)
        if isinstance(event, Done | Failed):
            self.seats.ended(utterance)
        self.wire.on_event(utterance, event)
