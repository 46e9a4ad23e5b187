"""Everything the engine keeps per utterance, and the table of live ones (engine thread only)."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic

import numpy as np
import structlog

from realtime.engine.commands import AddUtterance
from realtime.engine.config import EngineConfig
from realtime.engine.events import EngineEvent, Failed, SpeechStarted, SpeechStopped
from realtime.engine.ingest import Ingest, IngestBuffer
from realtime.engine.output import OutputProcessor
from scheduler import Request, Scheduler
from voxtral.audio import SAMPLE_RATE
from voxtral.errors import NoFreeSlot
from voxtral.runner import ModelRunner, State, UtteranceOutput, run_rows
from voxtral.speaker_encoder import SpeakerEncoder
from voxtral.speakers import SpeakerStream, SpeechSegment
from voxtral.turn_model import TurnModel
from voxtral.vad import Turn, Vad, VadConfig, VadStream

log = structlog.get_logger(__name__)


@dataclass
class Utterance(Generic[State]):
    """One engine request. The engine thread owns every field; `state` is the family's
    (`WhisperStream`, `VoxtralStream`), whose docstring says what its device worker owns."""

    request: Request  # the timeline (the scheduler writes it): items, positions, output token ids
    state: State  # the runner's (`ModelRunner[State].new_state`)
    vad: VadStream | None  # None: nothing reads its turns, so its audio skips the VAD's network
    output: OutputProcessor
    buffer: IngestBuffer = field(default_factory=IngestBuffer)
    num_client_samples: int = 0  # what the client sent, without the family's padding
    speakers: SpeakerStream | None = None  # where the session asked who said each word

    @property
    def id(self) -> str:
        return self.request.request_id


class Utterances(dict[str, Utterance[State]], Generic[State]):
    """The live utterances by id: their start, their audio, their end; and the events for
    their listeners since the engine last published them (`outbox`)."""

    def __init__(
        self, runner: ModelRunner[State], scheduler: Scheduler, ingest: Ingest, config: EngineConfig
    ) -> None:
        super().__init__()
        self.runner, self.scheduler, self.ingest, self.config = runner, scheduler, ingest, config
        self.outbox: list[tuple[str, EngineEvent]] = []

    def emit(self, utterance_id: str, event: EngineEvent) -> None:
        self.outbox.append((utterance_id, event))

    def consumed_samples(self) -> dict[str, int]:
        """Per utterance, how much of its client audio the model has computed, less what
        waits for its text (`Request.num_done`)."""
        lead, per_position = self.runner.spec.leading_silence_samples, self.runner.spec.samples_per_position
        return {u.id: max(0, u.request.num_done * per_position - lead) for u in self.values()}

    def add(self, command: AddUtterance) -> None:
        if command.utterance_id in self:
            self.emit(
                command.utterance_id,
                Failed("invalid_event", f"utterance {command.utterance_id!r} already exists"),
            )
            return
        request = Request(command.utterance_id, command.kind)
        asked = command.transcription
        try:
            state = self.runner.new_state(request, asked)
        except NoFreeSlot as exc:
            self.emit(command.utterance_id, Failed("too_many_sessions", str(exc)))
            return
        # Held from here on: whatever fails next, `fail` frees it.
        token_text = self.runner.spec.token_text
        output = OutputProcessor(
            words=[] if asked.word_times or asked.speakers else None,
            token_text=token_text() if token_text else None,
        )
        vad = command.vad
        if vad is None and (self.runner.spec.decodes_by_turns or asked.speakers):
            vad = VadConfig()
        stream = VadStream(vad) if vad is not None else None
        utterance = self[command.utterance_id] = Utterance(request, state, stream, output)
        if asked.speakers:
            utterance.speakers = SpeakerStream(vad)
        self.scheduler.add_request(request)
        self._ingest(
            utterance, np.zeros(self.runner.spec.leading_silence_samples, np.float32), time.monotonic()
        )

    def append(self, utterance: Utterance, samples: np.ndarray, arrived_at: float) -> None:
        utterance.num_client_samples += len(samples)
        if utterance.num_client_samples / SAMPLE_RATE > self.config.max_session_seconds:
            limit = f"utterance exceeds {self.config.max_session_seconds:g} s"
            self.fail(utterance, "session_too_long", limit)
        else:
            self._ingest(utterance, samples, arrived_at)
            if utterance.vad is not None:
                utterance.vad.feed(samples)
            if utterance.speakers is not None:
                utterance.speakers.feed(samples)

    def finish_input(self, utterance: Utterance, arrived_at: float) -> None:
        """The family's trailing silence, then the final item: what is buffered, padded."""
        buffer = utterance.buffer
        padding = self.runner.trailing_silence_samples(buffer.num_samples + len(buffer.pending))
        self._ingest(utterance, np.zeros(padding, np.float32), arrived_at)
        self.scheduler.finish_input(utterance.id, self.ingest.flush(buffer, utterance.id, arrived_at))

    def _ingest(self, utterance: Utterance, samples: np.ndarray, arrived_at: float) -> None:
        self.scheduler.add_items(
            utterance.id, self.ingest.append(utterance.buffer, samples, utterance.id, arrived_at)
        )

    def detect_turns(self, vad: Vad, speaker_encoder: SpeakerEncoder, turn_model: TurnModel) -> None:
        """VAD over every utterance's new audio in one batched call; each turn goes to the
        family (endpointing, skipping silence) and to the listener. Input that ends during
        speech ends the turn there. Pauses that a semantic end of turn judges are judged in one
        more batched call, and the same frames cut the speech of those that asked for
        speakers, whose due clips are embedded in another. A fault fails the utterances it
        comes from alone."""
        live = [
            u
            for u in self.values()
            if u.vad is not None and (u.vad.whole_frames() or (u.request.input_finished and u.vad.speaking))
        ]
        heard = run_rows(vad.probabilities, [u.vad for u in live])
        clips: list[tuple[Utterance, SpeechSegment, np.ndarray]] = []
        turns: dict[str, list[Turn]] = {}
        for utterance, probabilities in zip(live, heard, strict=True):
            with self.walled(utterance):
                if isinstance(probabilities, Exception):
                    raise probabilities
                turns[utterance.id] = vad.track(utterance.vad, probabilities)
                if utterance.speakers is not None:
                    clips += [(utterance, *clip) for clip in utterance.speakers.hear(probabilities)]
        paused = [u for u in live if u.id in turns and u.vad.awaiting]
        verdicts = run_rows(turn_model.complete, [u.vad.paused_clip() for u in paused])
        for utterance, complete in zip(paused, verdicts, strict=True):
            with self.walled(utterance):
                if isinstance(complete, Exception):
                    raise complete
                if (ended := utterance.vad.judge(complete)) is not None:
                    turns[utterance.id].append(ended)
        for utterance in live:
            if utterance.id in turns and utterance.id in self:
                with self.walled(utterance):
                    self._turns(utterance, turns[utterance.id])
        embeddings = run_rows(speaker_encoder.embed, [clip for _, _, clip in clips])
        for (utterance, segment, _), embedding in zip(clips, embeddings, strict=True):
            if utterance.id in self:
                with self.walled(utterance):
                    if isinstance(embedding, Exception):
                        raise embedding
                    utterance.speakers.embedded(segment, embedding)

    def _turns(self, utterance: Utterance, turns: list[Turn]) -> None:
        ended_at = utterance.num_client_samples * 1000 // SAMPLE_RATE
        if utterance.request.input_finished and (last := utterance.vad.end_turn(ended_at)):
            turns.append(last)
        for turn in turns:
            self.runner.turn(utterance.state, turn.speaking, self._position(turn.audio_ms))
            self.emit(
                utterance.id,
                SpeechStarted(turn.audio_ms) if turn.speaking else SpeechStopped(turn.audio_ms),
            )
        pause = utterance.vad.pause_ms()
        self.runner.pause(utterance.state, None if pause is None else self._position(pause))

    def _position(self, audio_ms: int) -> int:
        """The position of the client's audio `audio_ms` in."""
        sample = self.runner.spec.leading_silence_samples + audio_ms * SAMPLE_RATE // 1000
        return sample // self.runner.spec.samples_per_position

    @contextmanager
    def walled(self, utterance: Utterance) -> Iterator[None]:
        """Whatever raises in the block fails `utterance` alone; the engine and every other
        utterance go on."""
        try:
            yield
        except Exception as fault:
            self.failed(utterance, fault)

    def failed(self, utterance: Utterance, fault: Exception) -> None:
        """A fault of the utterance's own: it ends with `processing_error`, holding nothing."""
        log.error("engine.utterance_failed", utterance_id=utterance.id, exc_info=fault)
        if utterance.id in self:
            self.fail(
                utterance, "processing_error", f"transcription failed ({type(fault).__name__}); see the log"
            )

    def deliver_step(self, outputs: dict[str, list[UtteranceOutput]]) -> int:
        """A step's outputs in the order the utterances were added, not the runner's (a client's
        items finished in one step complete in the order it committed them); returns the tokens
        of those still here (an utterance that ended meanwhile has none)."""
        tokens = 0
        for utterance in list(self.values()):
            with self.walled(utterance):
                for output in outputs.get(utterance.id, []):
                    tokens += output.num_tokens
                    self.deliver(utterance, output)
        return tokens

    def deliver(self, utterance: Utterance, output: UtteranceOutput) -> None:
        if utterance.speakers is not None and output.words:
            output.words = utterance.speakers.label(output.words)
        audio_seconds = utterance.num_client_samples / SAMPLE_RATE
        for event in utterance.output.events(output, audio_seconds):
            self.emit(utterance.id, event)
        if output.finished:
            self.end(utterance)

    def fail(self, utterance: Utterance, code: str, message: str) -> None:
        self.emit(utterance.id, Failed(code, message))
        self.end(utterance)

    def end(self, utterance: Utterance) -> None:
        """Frees everything it held: cache references, device state, placeholders in flight."""
        del self[utterance.id]
        self.scheduler.finish_request(utterance.id)
        try:
            self.runner.release(utterance.state)
        except Exception:  # its device state is lost to it either way; the engine goes on
            log.exception("engine.release_failed", utterance_id=utterance.id)
