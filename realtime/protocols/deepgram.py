"""Deepgram's live transcription session over the engine (`/v1/listen`), as voice-agent
frameworks (pipecat, LiveKit Agents) and Deepgram's SDKs speak it.

Binary frames are audio in the query's encoding and rate; it goes to one engine utterance
(with the VAD when turns are asked for), resampled to 16 kHz. The engine's committed text goes
out as final `Results` (`is_final`), each for the audio since the one before; its interim tail
as interim `Results` (with `interim_results`); a turn the VAD ended (after `endpointing` ms of
silence) as a final `Results` with `speech_final`, and, once `utterance_end_ms` has passed
after the last final word with no speech since, `UtteranceEnd`. `Finalize` ends the
utterance (its text then comes `from_finalize`) and the next audio starts another on the same
clock; `CloseStream` (or an empty frame) ends it, then `Metadata`, then a normal close.
"""

import hashlib
from dataclasses import dataclass, field

import numpy as np
import soxr

from realtime.engine.events import (
    Delta,
    Done,
    EngineEvent,
    Failed,
    Interim,
    SpeechStarted,
    SpeechStopped,
    TurnEnded,
)
from realtime.protocols.common import ProtocolError
from realtime.protocols.deepgram_wire import (
    ListenOptions,
    Metadata,
    control,
    error,
    metadata,
    results,
    speech_started,
    utterance_end,
)
from realtime.protocols.port import IdleClose, SessionPort, UtterancePort
from voxtral.audio import SAMPLE_RATE, decode
from voxtral.runner import TimedWord, Transcription

# Deepgram closes a stream that sends neither audio nor a message for this long (NET-0001).
IDLE = IdleClose(10.0, 1011, "NET-0001", "no audio or KeepAlive for 10 s")


@dataclass
class Stream:
    """One engine utterance of the session: where its audio starts on the session's clock."""

    offset: float  # seconds
    finalized: bool = False  # the client's Finalize ended it: the rest of its text is one result
    held: list[Delta] = field(default_factory=list)  # that text, until it is all out
    stopped_at: float | None = None  # where the VAD last heard its speech end (session seconds)


class DeepgramSession:
    idle = IDLE

    def __init__(self, connection: SessionPort, options: ListenOptions, transcription: Transcription) -> None:
        self.connection = connection
        self.options = options
        self.transcription = transcription
        self.meta = Metadata(model_name=connection.model.name)
        self.resampler = self._resampler()
        self.carry = b""  # a PCM16 sample's first byte, its second still to come
        self.sha256 = hashlib.sha256()  # of every audio byte, for `Metadata`
        self.samples = 0  # the session's audio at 16 kHz: its clock
        self.utterance: UtterancePort | None = None  # receiving audio
        self.streams: dict[str, Stream] = {}  # started, not yet done
        self.cursor = 0.0  # where the last final result's audio ended (seconds)
        self.interim_shown = False  # the last interim result had text
        self.last_word_end: float | None = None  # of the last final word, while no UtteranceEnd followed
        self.turn_over = False  # the VAD ended the turn of the last final word and heard no speech since
        self.closing = False  # CloseStream: Metadata and the close follow the last result

    def _resampler(self) -> soxr.ResampleStream | None:
        rate = self.options.sample_rate
        return None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, "float32")

    @property
    def clock(self) -> float:
        return self.samples / SAMPLE_RATE

    def opened(self) -> None:
        """Deepgram says nothing until there is text."""

    def error_event(self, code: str, message: str) -> str:
        return error(code, message)

    def handle(self, message: str | bytes) -> None:
        if self.closing:
            return  # the stream ended: what comes after goes unheard, as on Deepgram
        try:
            if isinstance(message, bytes):
                if message:
                    self._audio(message)
                else:  # an empty frame is the older way to close a stream
                    self._close_stream()
                return
            kind = control(message)
        except ProtocolError as exc:
            self.connection.count_error(exc.code, exc.message)
            said = message[:200] if isinstance(message, str) else None
            self.connection.send(error(exc.code, exc.message, said))
            return
        if kind == "Finalize":
            self._end_utterance(finalized=True)
        elif kind == "CloseStream":
            self._close_stream()
        # KeepAlive: it was an event; the connection's idle clock starts again

    def _audio(self, data: bytes) -> None:
        self.sha256.update(data)
        if self.options.encoding == "pcm16":
            data, self.carry = self.carry + data, b""
            if len(data) % 2:
                data, self.carry = data[:-1], data[-1:]
        samples = decode(self.options.encoding, data)
        if self.resampler is not None:
            samples = self.resampler.resample_chunk(samples)
        if self.connection.draining or not len(samples):
            return
        if self.utterance is None:
            self.utterance = self.connection.start_utterance(self.options.vad(), self.transcription)
            self.streams[self.utterance.utterance_id] = Stream(self.clock)
        self.utterance.add_audio(samples)
        self.samples += len(samples)
        self._utterance_end()

    def _end_utterance(self, finalized: bool) -> None:
        """The utterance receiving audio ends: its text still comes."""
        if self.utterance is None:
            return
        if self.resampler is not None:  # what it still holds belongs to this utterance
            rest = self.resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            self.utterance.add_audio(rest)
            self.samples += len(rest)
            self.resampler = self._resampler()
        self.streams[self.utterance.utterance_id].finalized = finalized
        self.utterance.finish()
        self.utterance = None

    def _close_stream(self) -> None:
        self._end_utterance(finalized=False)
        self.closing = True
        if not self.streams:
            self._closed()

    def _closed(self) -> None:
        self.connection.send(metadata(self.meta, self.clock, self.sha256.hexdigest()))
        self.connection.end(1000, "", after_outbox=True)

    def _utterance_end(self) -> None:
        """`UtteranceEnd` once the engine has heard `utterance_end_ms` past the last final word,
        its VAD having ended that word's turn and heard no speech since (a turn that resumes
        sooner is told by its `SpeechStarted`, which comes with the audio that started it)."""
        gap = self.options.utterance_end_ms
        if gap is None or self.last_word_end is None or not self.turn_over or self.utterance is None:
            return
        heard = self.streams[self.utterance.utterance_id].offset + self.utterance.consumed_seconds
        if heard >= self.last_word_end + gap / 1000:
            self.connection.send(utterance_end(self.last_word_end))
            self.last_word_end = None

    def _receiving(self, utterance: str) -> bool:
        return self.utterance is not None and self.utterance.utterance_id == utterance

    def on_event(self, utterance: str, event: EngineEvent) -> None:
        stream = self.streams[utterance]
        if isinstance(event, Interim):
            if self.options.interim_results and (event.text.strip() or self.interim_shown):
                self.interim_shown = bool(event.text.strip())
                self.connection.send(
                    results(self.meta, self.cursor, self.clock, event.text, [], stream.offset, is_final=False)
                )
        elif isinstance(event, Delta):
            if stream.finalized:
                stream.held.append(event)
            else:
                self._final(stream, event.text, event.words or [])
        elif isinstance(event, SpeechStarted):
            self.turn_over = False
            if self.options.vad_events:
                self.connection.send(speech_started(stream.offset + event.audio_ms / 1000))
        elif isinstance(event, SpeechStopped):
            stream.stopped_at = stream.offset + event.audio_ms / 1000
        elif isinstance(event, TurnEnded):
            self.turn_over = True
            if self.options.endpointing_ms is not None:
                self._final(stream, "", [], end=stream.stopped_at, speech_final=True)
            self._utterance_end()
        elif isinstance(event, Done):
            if stream.finalized:  # what was said up to the Finalize, as one result
                words = [w for delta in stream.held for w in delta.words or []]
                self._final(stream, "".join(d.text for d in stream.held), words, from_finalize=True)
            del self.streams[utterance]
            if self._receiving(utterance):  # the server ended its input (drain)
                self.utterance = None
            if self.closing and not self.streams:
                self._closed()
        elif isinstance(event, Failed):
            del self.streams[utterance]
            if self._receiving(utterance):
                self.utterance = None
            self.connection.send(error(event.code, event.message))
            self.connection.end(1011, event.code[:100], after_outbox=True)

    def _final(
        self,
        stream: Stream,
        text: str,
        words: list[TimedWord],
        end: float | None = None,
        speech_final: bool = False,
        from_finalize: bool = False,
    ) -> None:
        """A final result for the audio from the last one's end to its last word's (or `end`,
        or what has been heard)."""
        if end is None:
            end = stream.offset + words[-1].end if words else self.clock
        end = max(self.cursor, end)
        self.connection.send(
            results(
                self.meta,
                self.cursor,
                end,
                text,
                words,
                stream.offset,
                is_final=True,
                speech_final=speech_final,
                from_finalize=from_finalize,
                speakers=self.options.diarize,
            )
        )
        self.cursor = end
        if text.strip():
            self.last_word_end, self.turn_over, self.interim_shown = end, False, False
