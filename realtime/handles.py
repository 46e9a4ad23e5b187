"""One utterance in the engine as the edge holds it, from its start to its end: where its
events go, the audio handed over, and how far the engine has consumed it (as its
`AudioConsumed` events say). A WebSocket connection and an upload each hold theirs through a
handle; the server's table of handles routes the engine's events."""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import structlog

from realtime.engine.events import AudioConsumed, Done, EngineEvent, Failed
from realtime.engine.loop import Engine
from realtime.metrics import Metrics
from scheduler import RequestKind
from voxtral.audio import SAMPLE_RATE
from voxtral.runner import Transcription
from voxtral.vad import VadConfig

log = structlog.get_logger("voxrt.handles")


class Listener(Protocol):
    """Where an utterance's engine events go: a WebSocket connection, or an upload."""

    def on_engine_event(self, utterance_id: str, event: EngineEvent) -> None: ...


@dataclass(eq=False)
class UtteranceHandle:
    utterance_id: str
    listener: Listener
    handles: "Handles"
    # A live client's: when its reads last found nothing waiting in TCP (None: an upload's).
    read_all_at: Callable[[], float] | None = None
    sent_samples: int = 0  # audio handed to the engine
    consumed_samples: int = 0  # of it, what the engine has computed, as the last step published
    audio_started_at: float | None = None  # when its first audio came
    finishing: bool = False  # input ended, result owed: its client may wait silently
    ended: bool = False  # done or failed in the engine, or aborted here
    delta_sent: bool = False  # its first delta went out

    def add_audio(self, samples: np.ndarray) -> None:
        """A live client's audio read behind a backlog (reads paused by backpressure) waited
        in TCP: it came when a real-time sender would have sent it, and not before the reads
        last caught up. An upload's came now. Audio of an utterance that ended (aborted as a
        close began) goes nowhere."""
        if self.ended or not len(samples):
            return
        now = time.monotonic()
        if self.audio_started_at is None:
            self.audio_started_at = now
        self.sent_samples += len(samples)
        arrived_at = now
        if self.read_all_at is not None:
            real_time = self.audio_started_at + self.sent_samples / SAMPLE_RATE
            arrived_at = max(self.read_all_at(), min(now, real_time))
        self.handles.metrics.audio_seconds.inc(len(samples) / SAMPLE_RATE)
        self.handles.engine.add_audio(self.utterance_id, samples, arrived_at)

    @property
    def consumed_seconds(self) -> float:
        """How much of its audio the engine has heard (its VAD included)."""
        return self.consumed_samples / SAMPLE_RATE

    def unconsumed_samples(self) -> int:
        """Its audio handed over and not yet computed: what a sender is held back by."""
        return self.sent_samples - self.consumed_samples

    def lag_seconds(self, now: float) -> float:
        """How far it is behind real time: the audio a real-time sender would have sent by
        now (or less, if it sent less) that the model has not computed. A client sending
        faster than real time is behind only once its audio's time has come."""
        if self.audio_started_at is None:
            return 0.0
        sent = min(self.sent_samples / SAMPLE_RATE, now - self.audio_started_at)
        return sent - self.consumed_samples / SAMPLE_RATE

    def finish(self) -> None:
        if not self.ended and not self.finishing:
            self.finishing = True
            self.handles.engine.finish_input(self.utterance_id)

    def close(self) -> None:
        """Out of the table; out of the engine too, unless it ended there (its rows go now)."""
        if self.handles.by_id.pop(self.utterance_id, None) is not None and not self.ended:
            self.handles.engine.abort(self.utterance_id)
        self.ended = True


class Handles:
    """utterance id -> its handle, for the utterances the edge started and has not closed."""

    def __init__(self, engine: Engine, metrics: Metrics) -> None:
        self.engine, self.metrics = engine, metrics
        self.by_id: dict[str, UtteranceHandle] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def open(
        self,
        utterance_id: str,
        listener: Listener,
        vad: VadConfig | None = None,
        transcription: Transcription = Transcription(),
        kind: RequestKind = RequestKind.LIVE,
        read_all_at: Callable[[], float] | None = None,
    ) -> UtteranceHandle:
        handle = self.by_id[utterance_id] = UtteranceHandle(utterance_id, listener, self, read_all_at)
        self.engine.add_utterance(utterance_id, vad, transcription, kind)
        return handle

    def route(self, events: list[tuple[str, EngineEvent]]) -> None:
        """A step's events to the listeners of their utterances (none: closed meanwhile). The
        audio consumed is the handle's to keep; an utterance done or failed has left the
        engine: its handle says so before its listener hears it."""
        for utterance_id, event in events:
            if (handle := self.by_id.get(utterance_id)) is None:
                continue
            if isinstance(event, AudioConsumed):
                handle.consumed_samples = event.samples
                continue
            if isinstance(event, Done | Failed):
                handle.ended = True
            try:
                handle.listener.on_engine_event(utterance_id, event)
            except Exception:
                event_name = type(event).__name__
                log.exception("handles.event_failed", utterance=utterance_id, engine_event=event_name)
