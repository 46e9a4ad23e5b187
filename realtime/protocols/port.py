"""The two faces between a connection and its wire session: what a session may ask of its
connection (`SessionPort`), and what the connection asks of its session (`WireSession`)."""

import asyncio
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from structlog.stdlib import BoundLogger

from realtime.config import ServedModel
from realtime.engine.events import EngineEvent
from voxtral.runner import ModelSpec, Transcription
from voxtral.vad import VadConfig


class UtterancePort(Protocol):
    """An utterance as the wire session that started it commands it."""

    utterance_id: str
    finishing: bool  # its input ended; its result is owed
    ended: bool  # done or failed in the engine, or aborted

    @property
    def consumed_seconds(self) -> float:
        """How much of its audio the engine has heard (its VAD included)."""
        ...

    def add_audio(self, samples: np.ndarray) -> None: ...

    def finish(self) -> None:
        """Its input ends here."""
        ...


class SessionPort(Protocol):
    """A connection as its wire session sees it: the served model, sending, and the
    utterances the session starts and aborts."""

    connection_id: str
    model: ServedModel  # the served model's names
    draining: bool  # the server ended every input: audio still coming is not the client's fault
    log: BoundLogger  # bound to the connection

    @property
    def spec(self) -> ModelSpec: ...

    def send(self, text: str) -> None: ...

    def send_error(self, code: str, message: str) -> None:
        """An error event in the session's shape, counted."""
        ...

    def count_error(self, code: str, message: str) -> None:
        """An error event the session sends itself: counted and logged."""
        ...

    def start_utterance(self, vad: VadConfig | None, transcription: Transcription) -> UtterancePort:
        """A new utterance; raises `ProtocolError` past the connection's limit."""
        ...

    def abort(self, utterance: str) -> None:
        """The utterance leaves the engine and the connection; its result is not owed."""
        ...

    def end(self, code: int, reason: str, after_outbox: bool = False) -> asyncio.Future:
        """Close the connection, after the events already sent where `after_outbox`."""
        ...


@dataclass(frozen=True)
class IdleClose:
    """A wire's own rule for a client that goes quiet: after `seconds` without an event, the
    close frame `code` with `reason`, after an error event saying `message`."""

    seconds: float
    code: int
    reason: str
    message: str


class WireSession(Protocol):
    idle: IdleClose | None  # None: the server's `idle_seconds` and `idle_timeout`

    def opened(self) -> None:
        """Send the protocol's greeting."""

    def handle(self, message: str | bytes) -> None:
        """One client event."""

    def on_event(self, utterance_id: str, event: EngineEvent) -> None:
        """One engine event of an utterance this session started."""

    def error_event(self, code: str, message: str) -> str:
        """An error event in the protocol's shape, for errors the connection raises."""
