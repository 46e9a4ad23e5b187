"""The realtime wire protocol (vLLM's `/v1/realtime`): parsing client events, building server events."""

import base64
import binascii
import json
import time
import uuid
from dataclasses import dataclass

import numpy as np

from voxtral.audio import pcm16_to_float32


class ProtocolError(Exception):
    """A client mistake: answered with an `error` event carrying `code`; the connection goes on."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class SessionUpdate:
    model: str | None
    interim: bool | None  # voxrt's extension: also send `transcription.interim`


@dataclass
class AudioAppend:
    samples: np.ndarray


@dataclass
class Commit:
    final: bool


ClientEvent = SessionUpdate | AudioAppend | Commit


def _field(event: dict, name: str, kind: type | tuple[type, ...], required: bool):
    value = event.get(name)
    if value is None:
        if required:
            raise ProtocolError("invalid_event", f"{event['type']}: missing field {name!r}")
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ProtocolError("invalid_event", f"{event['type']}: field {name!r} has the wrong type")
    return value


def decode_audio(text: str) -> np.ndarray:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError("invalid_audio", f"audio is not valid base64: {exc}") from exc
    try:
        return pcm16_to_float32(data)
    except ValueError as exc:
        raise ProtocolError("invalid_audio", str(exc)) from exc


def parse_client_event(message: str | bytes) -> ClientEvent:
    if isinstance(message, bytes):
        raise ProtocolError("invalid_event", "binary frames are not supported: send JSON text frames")
    try:
        event = json.loads(message)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError("invalid_json", f"invalid JSON: {exc}") from exc
    if not isinstance(event, dict):
        raise ProtocolError("invalid_event", "an event must be a JSON object")
    kind = event.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("invalid_event", "an event needs a string field 'type'")
    if kind == "input_audio_buffer.append":
        return AudioAppend(decode_audio(_field(event, "audio", str, required=True)))
    if kind == "input_audio_buffer.commit":
        return Commit(bool(_field(event, "final", bool, required=False)))
    if kind == "session.update":
        return SessionUpdate(
            _field(event, "model", str, required=False), _field(event, "interim", bool, False)
        )
    raise ProtocolError("unknown_event", f"Unknown event type: {kind[:200]}")


def _dump(event: dict) -> str:
    return json.dumps(event, ensure_ascii=False)


def session_created() -> tuple[str, str]:
    """A new connection's id (the wire calls it a session) and its `session.created` event."""
    connection_id = f"sess-{uuid.uuid4().hex}"
    return connection_id, _dump({"type": "session.created", "id": connection_id, "created": int(time.time())})


def transcription_delta(text: str) -> str:
    return _dump({"type": "transcription.delta", "delta": text})


def transcription_interim(text: str) -> str:
    """The unstable tail after the committed text (replaces the previous one; "" clears it)."""
    return _dump({"type": "transcription.interim", "text": text})


def transcription_done(text: str, audio_seconds: float, num_tokens: int) -> str:
    usage = {
        "prompt_tokens": 0,
        "completion_tokens": num_tokens,
        "total_tokens": num_tokens,
        "audio_seconds": round(audio_seconds, 3),
    }
    return _dump({"type": "transcription.done", "text": text, "usage": usage})


def error(code: str, message: str) -> str:
    return _dump({"type": "error", "error": message, "code": code})
