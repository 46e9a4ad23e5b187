"""A connection's utterances in the engine, the seats it holds: started under its limit, ended
once, and what admission and backpressure read of them (audio unconsumed, lag)."""

import asyncio
from collections.abc import Callable

from realtime.handles import Handles, Listener, UtteranceHandle
from realtime.metrics import Metrics
from realtime.progress import EngineProgress
from realtime.protocols.common import ProtocolError
from voxtral.audio import SAMPLE_RATE
from voxtral.runner import Transcription
from voxtral.vad import VadConfig


class Seats:
    """The utterances one connection started that are not yet done, failed or aborted."""

    def __init__(
        self,
        connection_id: str,
        max_utterances: int,
        handles: Handles,
        metrics: Metrics,
        progress: EngineProgress,
    ) -> None:
        self.connection_id, self.max_utterances = connection_id, max_utterances
        self.handles, self.metrics, self.progress = handles, metrics, progress
        self.held: dict[str, UtteranceHandle] = {}
        self.num_started = 0
        self.ended_samples = 0  # audio of its utterances that ended
        self.idle = asyncio.Event()  # none held
        self.idle.set()

    def start(
        self,
        listener: Listener,
        vad: VadConfig | None,
        transcription: Transcription,
        read_all_at: Callable[[], float],
    ) -> UtteranceHandle:
        """A new utterance in the engine; `ProtocolError` past the connection's limit."""
        if len(self.held) >= self.max_utterances:
            raise ProtocolError(
                "too_many_utterances",
                f"{len(self.held)} utterances of this connection are still being transcribed:"
                " wait for one to complete",
            )
        self.num_started += 1
        utterance = f"{self.connection_id}-{self.num_started}"
        handle = self.handles.open(utterance, listener, vad, transcription, read_all_at=read_all_at)
        self.held[utterance] = handle
        self.idle.clear()
        self.metrics.utterances_total.inc()
        self.metrics.utterances_active.inc()
        return handle

    def get(self, utterance: str) -> UtteranceHandle | None:
        return self.held.get(utterance)

    def finish_all(self) -> None:
        for handle in self.held.values():
            handle.finish()

    def abort(self, utterance: str) -> None:
        """It leaves the engine now; a wait for the engine to consume its audio is over."""
        if utterance in self.held:
            self.ended(utterance)
            self.progress.wake()

    def abort_all(self) -> None:
        for utterance in list(self.held):
            self.abort(utterance)

    def ended(self, utterance: str) -> None:
        """Done or failed in the engine, or aborted: its seat is free."""
        if (handle := self.held.pop(utterance, None)) is None:
            return
        handle.close()
        self.ended_samples += handle.sent_samples
        self.metrics.utterances_active.dec()
        if not self.held:
            self.idle.set()

    @property
    def audio_seconds(self) -> float:
        """The audio its utterances handed to the engine."""
        return (self.ended_samples + sum(h.sent_samples for h in self.held.values())) / SAMPLE_RATE

    @property
    def finishing(self) -> bool:
        """An utterance's input ended and its result is owed: the client may wait silently."""
        return any(h.finishing for h in self.held.values())

    def unconsumed_samples(self) -> int:
        return sum(h.unconsumed_samples() for h in self.held.values())

    def lag_seconds(self, now: float) -> float:
        """How far its furthest utterance is behind real time (`UtteranceHandle.lag_seconds`)."""
        return max([0.0, *(h.lag_seconds(now) for h in self.held.values())])

    def __len__(self) -> int:
        return len(self.held)
