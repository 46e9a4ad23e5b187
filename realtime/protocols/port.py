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


class SessionPort(Protocol):
    """A connection as its wire session sees it: the served model, sending, and the
    utterances the session starts, feeds, ends and aborts."""

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

    def start_utterance(self, vad: VadConfig | None, transcription: Transcription) -> str:
        """A new utterance's id; raises `ProtocolError` past the connection's limit."""
        ...

    def add_audio(self, utterance: str, samples: np.ndarray) -> None: ...

    def is_finishing(self, utterance: str | None) -> bool: ...

    def consumed_seconds(self, utterance: str) -> float:
        """How much of the utterance's audio the engine has heard (its VAD included)."""
        ...

    def finish(self, utterance: str) -> None: ...

    def abort(self, utterance: str) -> None: ...

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
