"""What both wire protocols share: a client mistake, and audio as base64 PCM16."""

import base64
import binascii
import json

import numpy as np

from voxtral.audio import pcm16_to_float32
from voxtral.runner import ModelRunner, Transcription


class ProtocolError(Exception):
    """A client mistake: answered with an `error` event carrying `code`; the connection goes on."""

    def __init__(self, code: str, message: str, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id  # the client's, where its protocol has one


def decode_audio(text: str) -> np.ndarray:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError("invalid_audio", f"audio is not valid base64: {exc}") from exc
    try:
        return pcm16_to_float32(data)
    except ValueError as exc:
        raise ProtocolError("invalid_audio", str(exc)) from exc


def load_event(message: str | bytes) -> dict:
    """A client event as a JSON object with a string `type`, or the error that says why not."""
    if isinstance(message, bytes):
        raise ProtocolError("invalid_event", "binary frames are not supported: send JSON text frames")
    try:
        event = json.loads(message)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError("invalid_json", f"invalid JSON: {exc}") from exc
    if not isinstance(event, dict):
        raise ProtocolError("invalid_event", "an event must be a JSON object")
    if not isinstance(event.get("type"), str):
        raise ProtocolError("invalid_event", "an event needs a string field 'type'")
    return event


def transcription(
    runner: ModelRunner,
    language: str | None,
    task: str | None,
    prompt: str | None = None,
    word_times: bool = False,
) -> Transcription:
    """The language, task, prompt and word times a session asked for, or the error naming what
    the served model supports."""
    if word_times and not runner.word_times:
        raise ProtocolError("unsupported_option", f"the served model ({runner.name}) gives no word times")
    if task not in (None, "transcribe", "translate"):
        raise ProtocolError("invalid_value", f"task {task[:50]!r}: choose 'transcribe' or 'translate'")
    if task == "translate" and not runner.translates:
        raise ProtocolError(
            "unsupported_task", "the served model transcribes only; serve whisper-base to translate"
        )
    if language is None or runner.languages is None:
        return Transcription(None, task or "transcribe", prompt or "", word_times)
    if language.lower() not in runner.languages:
        supported = ", ".join(sorted(runner.languages))
        raise ProtocolError(
            "unsupported_language", f"language {language[:50]!r} is not served; supported: {supported}"
        )
    return Transcription(language.lower(), task or "transcribe", prompt or "", word_times)
