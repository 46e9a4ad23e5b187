"""What both wire protocols share: client events parsed once into typed events, a client
mistake as the wire's error code, audio as base64."""

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Annotated, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import PydanticCustomError
from structlog.stdlib import BoundLogger

from realtime.config import ServedModel
from voxtral.audio import pcm16_to_float32
from voxtral.runner import ModelSpec, Transcription

# A validation error of one of these types carries its wire code; any other is `invalid_event`
# for a field of the event itself and `invalid_value` for a value nested in one.
WIRE_CODES = ("invalid_event", "invalid_value", "invalid_audio")


# The bounds on what a client may name: every string reaches the engine (or a log) bounded.
MAX_NAME_CHARS = 256  # a model name, an event id
MAX_CODE_CHARS = 32  # a language, a task
MAX_PROMPT_CHARS = 4096  # a prompt; the model reads its last tokens (Whisper: 223)
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
Code = Annotated[str, Field(max_length=MAX_CODE_CHARS)]
Prompt = Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
MAX_KEYTERMS = 100  # words to expect that a session may name, as Deepgram bounds its keyterms
Keyterms = Annotated[list[Name], Field(max_length=MAX_KEYTERMS)]


class ProtocolError(Exception):
    """A client mistake: answered with an `error` event carrying `code`; the connection goes on."""

    def __init__(self, code: str, message: str, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id  # the client's, where its protocol has one


class WireObject(BaseModel):
    """What a client sends, an event or an object inside one, as its wire defines it: a field
    of the wrong type is an error (no coercion: `"yes"` is not a bool), a field the wire does
    not know is ignored."""

    model_config = ConfigDict(strict=True, frozen=True)


def _base64(value: object) -> bytes:
    if not isinstance(value, str):
        raise PydanticCustomError("invalid_event", "must be a string of base64 audio")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PydanticCustomError(
            "invalid_audio", "audio is not valid base64: {why}", {"why": str(exc)}
        ) from None


def _pcm16(value: object) -> np.ndarray:
    data = _base64(value)
    try:
        return pcm16_to_float32(data)
    except ValueError as exc:
        raise PydanticCustomError("invalid_audio", "{why}", {"why": str(exc)}) from None


Base64 = Annotated[bytes, PlainValidator(_base64)]  # audio bytes, coded as the session's format says
Pcm16 = Annotated[np.ndarray, PlainValidator(_pcm16)]  # base64 PCM16 on the wire, float32 samples once parsed

Event = TypeVar("Event", bound=WireObject)


def parse_event(message: str | bytes, events: Mapping[str, type[Event]], unknown_code: str) -> Event:
    """A client event parsed into its wire's typed event, or the `ProtocolError` that says
    why not (with the client's `event_id`, where it sent one)."""
    event = _load(message)
    kind, event_id = event["type"], event.get("event_id")
    event_id = event_id if isinstance(event_id, str) and len(event_id) <= MAX_NAME_CHARS else None
    if (model := events.get(kind)) is None:
        raise ProtocolError(unknown_code, f"Unknown or unsupported event type: {kind[:200]}", event_id)
    try:
        return model.model_validate(event)
    except ValidationError as exc:
        error = exc.errors()[0]
        code = error["type"]
        if code not in WIRE_CODES:
            code = "invalid_event" if len(error["loc"]) <= 1 else "invalid_value"
        where = ".".join(str(part) for part in error["loc"])
        raise ProtocolError(code, f"{kind}: {where}: {error['msg']}", event_id) from None


def _load(message: str | bytes) -> dict:
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
    if _SURROGATE_ESCAPE.search(message) and (where := _not_unicode(event)) is not None:
        # Legal JSON (a lone surrogate escape) that is no text: nothing past here may meet it.
        raise ProtocolError("invalid_event", f"{where}: not valid Unicode (a lone surrogate?)")
    return event


# A frame is UTF-8 text: only a JSON escape can put a surrogate into a parsed string, so the
# parsed event is searched only when its frame has one (an audio event's megabyte is not).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _not_unicode(event: dict) -> str | None:
    """The path of the first key or string in `event` that UTF-8 cannot encode, or None."""
    stack: list[tuple[str, object]] = [("event", event)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str) and not _encodes(value):
            return path
        children = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        )
        for key, child in children:
            if isinstance(key, str) and not _encodes(key):
                return f"{path}: a key"
            stack.append((f"{path}.{key}", child))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_model(served: ServedModel, asked: str | None, log: BoundLogger) -> None:
    """A model the client named: the served one, or (unless --strict-model) served in its
    place, as vLLM serves its one model whatever the name."""
    if asked is not None and asked not in served.names:
        if served.strict_model:
            raise ProtocolError("unknown_model", f"unknown model {asked[:200]!r}")
        log.warning("session.model_substituted", requested=asked[:200])


def asked(
    spec: ModelSpec,
    before: Transcription = Transcription(),
    *,
    language: str | None = None,
    task: str | None = None,
    prompt: str | None = None,
    word_times: bool | None = None,
    speakers: bool | None = None,
    keyterms: Sequence[str] | None = None,
) -> Transcription:
    """`before` with the options a session names (None: as it was), checked against the served
    model: where every wire's options become the engine's, or the error naming what the model
    supports. Each wire maps its own fields onto these."""
    named = {
        "language": language,
        "task": task,
        "prompt": prompt,
        "word_times": word_times,
        "speakers": speakers,
        "keyterms": None if keyterms is None else tuple(term.strip() for term in keyterms if term.strip()),
    }
    merged = replace(before, **{name: value for name, value in named.items() if value is not None})
    if (merged.word_times or merged.speakers) and not spec.word_times:
        option = "speaker labels" if merged.speakers else "word times"
        raise ProtocolError(
            "unsupported_option", f"the served model ({spec.name}) gives no word times: no {option}"
        )
    if merged.task not in ("transcribe", "translate"):
        raise ProtocolError("invalid_value", f"task {merged.task[:50]!r}: choose 'transcribe' or 'translate'")
    if merged.task == "translate" and not spec.translates:
        raise ProtocolError(
            "unsupported_task", "the served model transcribes only; serve whisper-base to translate"
        )
    if merged.language is None or spec.languages is None:
        return replace(merged, language=None)
    if merged.language.lower() not in spec.languages:
        supported = ", ".join(sorted(spec.languages))
        raise ProtocolError(
            "unsupported_language", f"language {merged.language[:50]!r} is not served; supported: {supported}"
        )
    return replace(merged, language=merged.language.lower())
