"""vLLM's realtime wire protocol (`/v1/realtime`): its client events, its server events, its session."""

import json
import time

from realtime.engine.events import Delta, Done, EngineEvent, Failed, Interim, LanguageDetected
from realtime.protocols.common import (
    Code,
    Keyterms,
    Name,
    Pcm16,
    Prompt,
    ProtocolError,
    WireObject,
    asked,
    check_model,
    parse_event,
)
from realtime.protocols.port import SessionPort, UtterancePort
from voxtral.runner import TimedWord, Transcription


class SessionUpdate(WireObject):
    model: Name | None = None
    interim: bool | None = None  # voxrt's extension: also send `transcription.interim`
    language: Code | None = None  # voxrt's extension, for multilingual models; None: detected
    task: Code | None = None  # voxrt's extension: "transcribe" or "translate"
    prompt: Prompt | None = None  # text said before: names, terms, spelling
    word_timestamps: bool | None = None  # voxrt's extension: deltas and done carry their words, timed
    diarize: bool | None = None  # voxrt's extension: their words, timed, each with its speaker
    keyterms: Keyterms | None = None  # voxrt's extension: words to expect (names, terms)


class AudioAppend(WireObject):
    audio: Pcm16


class Commit(WireObject):
    final: bool | None = None  # the input ends: `transcription.done` follows


EVENTS = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": AudioAppend,
    "input_audio_buffer.commit": Commit,
}


def _dump(event: dict) -> str:
    return json.dumps(event, ensure_ascii=False)


def words_field(words: list[TimedWord] | None) -> dict:
    """`words` for a client that asked for word timestamps or speakers; nothing for one that did not."""
    if words is None:
        return {}
    return {"words": [_word(w) for w in words]}


def _word(w: TimedWord) -> dict:
    speaker = {} if w.speaker is None else {"speaker": w.speaker}
    return {"word": w.text, "start": w.start, "end": w.end, "probability": round(w.probability, 4), **speaker}


def transcription_delta(text: str, words: list[TimedWord] | None) -> str:
    return _dump({"type": "transcription.delta", "delta": text, **words_field(words)})


def transcription_interim(text: str) -> str:
    """The unstable tail after the committed text (replaces the previous one; "" clears it)."""
    return _dump({"type": "transcription.interim", "text": text})


def transcription_language(language: str) -> str:
    """The language a multilingual model detected, before the text it hears in it."""
    return _dump({"type": "transcription.language", "language": language})


def transcription_done(
    text: str, audio_seconds: float, num_tokens: int, words: list[TimedWord] | None
) -> str:
    usage = {
        "prompt_tokens": 0,
        "completion_tokens": num_tokens,
        "total_tokens": num_tokens,
        "audio_seconds": round(audio_seconds, 3),
    }
    return _dump({"type": "transcription.done", "text": text, "usage": usage, **words_field(words)})


def error(code: str, message: str) -> str:
    return _dump({"type": "error", "error": message, "code": code})


class VllmSession:
    """vLLM's session: audio before any commit starts an utterance (documented); `final`
    ends its input; after `transcription.done` the next commit or audio starts a new one."""

    idle = None  # the server's idle rule

    def __init__(self, connection: SessionPort) -> None:
        self.connection = connection
        self.utterance: UtterancePort | None = None  # the running utterance
        self.interim = False  # the client asked for `transcription.interim`
        # language, task, prompt and word times of the utterances to come
        self.transcription = Transcription()

    def opened(self) -> None:
        self.connection.send(
            _dump(
                {"type": "session.created", "id": self.connection.connection_id, "created": int(time.time())}
            )
        )

    def error_event(self, code: str, message: str) -> str:
        return error(code, message)

    def handle(self, message: str | bytes) -> None:
        try:
            event = parse_event(message, EVENTS, "unknown_event")
            if isinstance(event, SessionUpdate):
                self._update(event)
            elif isinstance(event, AudioAppend):
                if self.connection.draining:
                    return  # the server ended the input; the client will hear `transcription.done`
                if self._input_finished():
                    raise ProtocolError("input_finished", "audio after the final commit: wait for done")
                self._running().add_audio(event.audio)
            else:
                if self.connection.draining:  # every input has ended: a commit starts nothing
                    if self.utterance is None:
                        raise ProtocolError("shutting_down", "the server is draining: no new utterance")
                    return
                if self._input_finished():
                    raise ProtocolError("input_finished", "input already finished: wait for done")
                utterance = self._running()
                if event.final:
                    utterance.finish()
        except ProtocolError as exc:
            self.connection.send_error(exc.code, exc.message)

    def _update(self, event: SessionUpdate) -> None:
        check_model(self.connection.model, event.model, self.connection.log)
        if event.interim is not None:
            self.interim = event.interim
        self.transcription = asked(
            self.connection.spec,
            self.transcription,
            language=event.language,
            task=event.task or None,
            prompt=event.prompt,
            word_times=event.word_timestamps,
            speakers=event.diarize,
            keyterms=event.keyterms,
        )

    def _input_finished(self) -> bool:
        """The running utterance's input ended; its `transcription.done` is still to come."""
        return self.utterance is not None and self.utterance.finishing and not self.utterance.ended

    def _running(self) -> UtterancePort:
        if self.utterance is None:
            self.utterance = self.connection.start_utterance(transcription=self.transcription)
        return self.utterance

    def on_event(self, utterance: str, event: EngineEvent) -> None:
        if isinstance(event, Interim):
            if self.interim:
                self.connection.send(transcription_interim(event.text))
        elif isinstance(event, Delta):
            self.connection.send(transcription_delta(event.text, event.words))
        elif isinstance(event, LanguageDetected):
            self.connection.send(transcription_language(event.language))
        elif isinstance(event, Done | Failed):
            if isinstance(event, Done):
                done = transcription_done(event.text, event.audio_seconds, event.num_tokens, event.words)
                self.connection.send(done)
            else:
                self.connection.send(error(event.code, event.message))
            self.utterance = None
        # vLLM's wire has no turn events: SpeechStarted / SpeechStopped are not sent.
