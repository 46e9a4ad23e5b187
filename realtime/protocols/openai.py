"""OpenAI's Realtime transcription session over the engine: one conversation item per turn.

With `server_vad` turn detection (OpenAI's default) the session's audio goes to one engine
utterance, whose VAD ends each turn: at `SpeechStopped` the item is committed and the next
audio is the next item's, and at `TurnEnded` (the turn's text is all out) it is completed.
Items are cut at the sample where the VAD cut them, and each turn is decoded after the one
before it. With `turn_detection: null` each client commit ends an utterance and its item.
Text streams as `...input_audio_transcription.delta` of the item it belongs to, and
`.completed` carries the item's whole transcript: its deltas, joined. A session whose
transcription model is OpenAI's diarizing one (`DIARIZE_MODEL`) also gets the item's text
as `...input_audio_transcription.segment` events, one per run of one speaker's words, each
sent once the next speaker's first word or the item's end closes it.
"""

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import soxr

from realtime.engine.events import (
    Delta,
    Done,
    EngineEvent,
    Failed,
    LanguageDetected,
    SpeechStarted,
    SpeechStopped,
    TurnEnded,
)
from realtime.protocols.common import ProtocolError, asked, check_model
from realtime.protocols.openai_wire import (
    Append,
    BetaUpdate,
    Clear,
    Commit,
    InputFormat,
    SemanticVad,
    ServerVad,
    TranscriptionSettings,
    Update,
    dump,
    error,
    item_object,
    logprobs,
    new_id,
    parse,
    session_object,
)
from realtime.protocols.port import SessionPort, UtterancePort
from voxtral.audio import SAMPLE_RATE, decode
from voxtral.runner import TimedWord, Transcription

# The transcription model name that asks for speakers: served as the served model, diarized.
DIARIZE_MODEL = "gpt-4o-transcribe-diarize"


@dataclass
class Item:
    """A conversation item: a turn of an utterance's audio, and the text streamed for it."""

    id: str
    start_ms: int  # where its audio begins, on the session's clock
    end_ms: int | None = None  # where it ends, once committed (`input_audio_buffer.committed` went out)
    cleared: bool = False  # its audio was cleared: none of its text goes out
    deltas: list[str] = field(default_factory=list)
    words: list[TimedWord] | None = None  # the deltas' words, where the session asked for logprobs
    run: list[TimedWord] = field(default_factory=list)  # one speaker's words not yet in a segment

    @property
    def committed(self) -> bool:
        return self.end_ms is not None


@dataclass
class UtteranceItems:
    """An engine utterance of the session, until done or failed: one item per turn."""

    start_ms: int  # where its audio begins, on the session's clock
    items: deque[Item] = field(default_factory=deque)  # those whose text is still coming, in order
    language: str | None = None  # what a multilingual model detected
    speakers: bool = False  # its words carry speakers: its items' text goes out in segments too


class OpenAISession:
    idle = None  # the server's idle rule

    def __init__(self, connection: SessionPort) -> None:
        self.connection = connection
        self.session_id = new_id("sess")
        self.settings = TranscriptionSettings()  # model, language, prompt as the client set them
        self.transcription = Transcription()  # what the settings ask of the engine
        self.vad: ServerVad | SemanticVad | None = ServerVad()
        self.format = InputFormat()
        self.resampler: soxr.ResampleStream | None = self._resampler()
        self.utterance: UtterancePort | None = None  # receiving audio; its last item is the input buffer
        self.buffered_samples = 0  # in the input buffer, at 16 kHz
        self.session_samples = 0  # all audio of the session, at 16 kHz: the clock of audio_*_ms
        self.turns: dict[str, UtteranceItems] = {}  # per utterance
        self.previous_item: str | None = None

    def _resampler(self) -> soxr.ResampleStream | None:
        rate = self.format.rate
        return None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, "float32")

    def _session(self) -> dict:
        model = self.connection.model.name
        return session_object(self.session_id, model, self.format, self.settings, self.vad)

    def opened(self) -> None:
        self.connection.send(dump("session.created", session=self._session()))

    def error_event(self, code: str, message: str) -> str:
        return error(code, message)

    def handle(self, message: str | bytes) -> None:
        event_id = None  # the client's, for an error about its event
        try:
            event = parse(message)
            event_id = event.event_id
            if isinstance(event, Update | BetaUpdate):
                self._update(event.session.settings())
            elif isinstance(event, Append):
                if not self.connection.draining:  # the server ended the turn: no new one starts
                    self._append(self._decode(event.audio))
            elif isinstance(event, Commit):
                self._commit()
            elif isinstance(event, Clear):
                if self.utterance is not None:
                    self._clear(self.utterance.utterance_id)
                self.resampler = self._resampler()
                self.connection.send(dump("input_audio_buffer.cleared"))
        except ProtocolError as exc:
            self.connection.count_error(exc.code, exc.message)
            self.connection.send(error(exc.code, exc.message, exc.event_id or event_id))

    def _update(self, update: TranscriptionSettings) -> None:
        if update.model != DIARIZE_MODEL:
            check_model(self.connection.model, update.model, self.connection.log)
        if update.format is not None and update.format != self.format:
            if self.buffered_samples:
                raise ProtocolError(
                    "invalid_value",
                    "the audio format cannot change while the input buffer holds audio",
                )
            self.format = update.format
            self.resampler = self._resampler()
        self.transcription = asked(
            self.connection.spec,
            self.transcription,
            language=update.language,
            prompt=update.prompt,
            word_times=update.logprobs,
            speakers=None if update.model is None else update.model == DIARIZE_MODEL,
            keyterms=update.keyterms,
        )
        for name in ("model", "language", "prompt", "logprobs", "keyterms"):
            if (value := getattr(update, name)) is not None:
                setattr(self.settings, name, value)
        if update.set_turn_detection:
            self.vad = update.turn_detection
        self.connection.send(dump("session.updated", session=self._session()))

    def _decode(self, data: bytes) -> np.ndarray:
        try:
            return decode(self.format.encoding, data)
        except ValueError as exc:
            raise ProtocolError("invalid_audio", f"input_audio_buffer.append: audio: {exc}") from None

    def _append(self, samples: np.ndarray) -> None:
        if self.resampler is not None:
            samples = self.resampler.resample_chunk(samples)
        if self.utterance is None:
            vad = self.vad and self.vad.vad_config()
            self.utterance = self.connection.start_utterance(vad or None, self.transcription)
            speakers = self.transcription.speakers
            self.turns[self.utterance.utterance_id] = UtteranceItems(self._clock_ms(), speakers=speakers)
            self._new_item(self._clock_ms())
        self._buffer(samples)

    def _clock_ms(self) -> int:
        return self.session_samples * 1000 // SAMPLE_RATE

    def _new_item(self, start_ms: int) -> None:
        """The input buffer's next item, receiving the audio from `start_ms` on."""
        words = [] if self.settings.logprobs else None
        self.turns[self.utterance.utterance_id].items.append(Item(new_id("item"), start_ms, words=words))

    def _buffer(self, samples: np.ndarray) -> None:
        """16 kHz audio into the input buffer, on the session's clock."""
        self.utterance.add_audio(samples)
        self.buffered_samples += len(samples)
        self.session_samples += len(samples)

    def _commit(self) -> None:
        if self.utterance is None or not self.buffered_samples:
            raise ProtocolError("input_audio_buffer_commit_empty", "the input audio buffer is empty")
        if self.resampler is not None:  # what it still holds belongs to this item
            self._buffer(self.resampler.resample_chunk(np.zeros(0, np.float32), last=True))
            self.resampler = self._resampler()
        self._end_item(self._clock_ms())
        self._stop_receiving()

    def _end_item(self, end_ms: int) -> None:
        """The input buffer's item is committed: its audio ends at `end_ms`."""
        item = self.turns[self.utterance.utterance_id].items[-1]
        item.end_ms = end_ms
        self.connection.send(
            dump("input_audio_buffer.committed", item_id=item.id, previous_item_id=self.previous_item)
        )
        added = item_object(item.id, None)
        self.connection.send(dump("conversation.item.added", previous_item_id=self.previous_item, item=added))
        self.previous_item = item.id
        self.buffered_samples = 0

    def _stop_receiving(self) -> None:
        """The utterance's input ends; the next audio starts a new one."""
        self.utterance.finish()
        self.utterance, self.buffered_samples = None, 0

    def _clear(self, utterance: str) -> None:
        """The input buffer's audio goes unheard: its utterance is aborted, or finished for the
        items committed before it, whose text is still coming."""
        items = self.turns[utterance].items
        if len(items) == 1:
            self.connection.abort(utterance)
            self._forget(utterance)
            self.utterance, self.buffered_samples = None, 0
        else:
            items[-1].cleared = True
            self._stop_receiving()

    def on_event(self, utterance: str, event: EngineEvent) -> None:
        turns = self.turns[utterance]
        items = turns.items
        if isinstance(event, SpeechStarted | SpeechStopped):
            if self.vad is None or not self._receiving(utterance):
                return  # turn events are server VAD's, and only for the turn being spoken
            item, at = items[-1], turns.start_ms + event.audio_ms
            if isinstance(event, SpeechStarted):
                start = max(item.start_ms, at - self.vad.prefix_padding_ms)
                self.connection.send(
                    dump("input_audio_buffer.speech_started", item_id=item.id, audio_start_ms=start)
                )
            else:
                self.connection.send(
                    dump("input_audio_buffer.speech_stopped", item_id=item.id, audio_end_ms=at)
                )
                self._end_item(at)
                self._new_item(at)
        elif isinstance(event, LanguageDetected):
            turns.language = event.language
        elif isinstance(event, Delta):
            item = items[0]
            item.deltas.append(event.text)
            if item.words is not None:
                item.words += event.words or []
            if not item.cleared:
                words = event.words if item.words is not None else None
                self._transcription("delta", item.id, delta=event.text, **self._logprobs(words))
                for word in (event.words or []) if turns.speakers else []:
                    if item.run and word.speaker != item.run[-1].speaker:
                        self._segment(turns, item)
                    item.run.append(word)
        elif isinstance(event, TurnEnded):
            if len(items) > 1:  # the turn's item was committed at its end; the last is still open
                self._complete(turns, items.popleft())
        elif isinstance(event, Done):
            for item in items:
                if item.committed or item.deltas:
                    self._complete(turns, item)
            self._forget(utterance)
        elif isinstance(event, Failed):
            self._forget(utterance)
            self.connection.send(error(event.code, event.message, server=True))

    def _complete(self, turns: UtteranceItems, item: Item) -> None:
        if item.cleared:
            return
        end_ms = self._clock_ms() if item.end_ms is None else item.end_ms
        usage = {"type": "duration", "seconds": round((end_ms - item.start_ms) / 1000, 3)}
        if item.run:
            self._segment(turns, item)
        transcript = "".join(item.deltas)
        # `language` (voxrt's extension): what a multilingual model detected, when not set.
        detected = {"language": turns.language} if turns.language else {}
        self._transcription(
            "completed", item.id, transcript=transcript, usage=usage, **detected, **self._logprobs(item.words)
        )
        self.connection.send(dump("conversation.item.done", item=item_object(item.id, transcript)))

    def _segment(self, turns: UtteranceItems, item: Item) -> None:
        """The item's run of one speaker's words, as OpenAI's diarized segment: its times in
        seconds on the session's audio."""
        run, item.run = item.run, []
        text = "".join(t.token for word in run for t in word.tokens).strip()
        start, end = turns.start_ms / 1000 + run[0].start, turns.start_ms / 1000 + run[-1].end
        fields = {
            "id": new_id("seg"),
            "speaker": run[0].speaker,
            "start": round(start, 3),
            "end": round(end, 3),
        }
        self._transcription("segment", item.id, text=text, **fields)

    @staticmethod
    def _logprobs(words: list[TimedWord] | None) -> dict:
        """`logprobs` for a session that included them; nothing for one that did not."""
        return {} if words is None else {"logprobs": logprobs(words)}

    def _transcription(self, kind: str, item_id: str, **fields: object) -> None:
        name = f"conversation.item.input_audio_transcription.{kind}"
        self.connection.send(dump(name, item_id=item_id, content_index=0, **fields))

    def _receiving(self, utterance: str) -> bool:
        return self.utterance is not None and self.utterance.utterance_id == utterance

    def _forget(self, utterance: str) -> None:
        del self.turns[utterance]
        if self._receiving(utterance):  # failed while receiving audio
            self.utterance, self.buffered_samples = None, 0
