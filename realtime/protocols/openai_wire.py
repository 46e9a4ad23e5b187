"""OpenAI's Realtime transcription protocol on the wire: its client events read, its server events built.

Shapes follow the openai Python SDK's `types/realtime` (GA `session.update` with a
`transcription` session) and the older beta `transcription_session.update`.
"""

import json
import uuid
from dataclasses import dataclass

from realtime.protocols.common import ProtocolError, load_event
from voxtral.runner import TimedWord

INPUT_RATES = (24000, 16000)  # OpenAI's PCM is 24 kHz; 16 kHz is voxrt's extension
LOGPROBS = "item.input_audio_transcription.logprobs"  # the one `include` a transcription session has


@dataclass
class ServerVad:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass
class TranscriptionSettings:
    """What a transcription session sets; None where an update leaves a field as it is."""

    rate: int | None = None
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    turn_detection: ServerVad | None = None
    set_turn_detection: bool = False  # the update names turn_detection (null turns it off)
    logprobs: bool | None = None  # `include` names LOGPROBS: deltas and completed carry them


@dataclass
class Append:
    audio: str  # base64 PCM16 at the session's rate


@dataclass
class Commit:
    pass


@dataclass
class Clear:
    pass


@dataclass
class Update:
    settings: TranscriptionSettings


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _object(value: object, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError("invalid_value", f"{where} must be an object")
    return value


def _number(obj: dict, name: str, kind: type, where: str, low: float, high: float):
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ProtocolError("invalid_value", f"{where}.{name} must be a number in [{low:g}, {high:g}]")
    return kind(value)


def _turn_detection(value: object, where: str) -> ServerVad | None:
    if value is None:
        return None
    value = _object(value, where)
    if value.get("type") != "server_vad":
        raise ProtocolError(
            "invalid_value", f"{where}.type {value.get('type')!r} is not supported: use server_vad or null"
        )
    vad = ServerVad()
    for name, kind, high in (
        ("threshold", float, 1.0),
        ("prefix_padding_ms", int, 10_000),
        ("silence_duration_ms", int, 10_000),
    ):
        if (number := _number(value, name, kind, where, 0, high)) is not None:
            setattr(vad, name, number)
    return vad


def _transcription(settings: TranscriptionSettings, value: object, where: str) -> None:
    value = _object(value, where)
    for name in ("model", "language", "prompt"):
        if (text := value.get(name)) is not None and not isinstance(text, str):
            raise ProtocolError("invalid_value", f"{where}.{name} must be a string")
        setattr(settings, name, text)


def _include(value: object) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, list) or any(name != LOGPROBS for name in value):
        raise ProtocolError("invalid_value", f"session.include must be a list of {LOGPROBS!r} or empty")
    return bool(value)


def _settings(kind: str, session: dict) -> TranscriptionSettings:
    settings = TranscriptionSettings(logprobs=_include(session.get("include")))
    if kind == "transcription_session.update":  # the beta form
        if (fmt := session.get("input_audio_format")) not in (None, "pcm16"):
            raise ProtocolError("invalid_value", f"input_audio_format {fmt!r} is not supported: use pcm16")
        settings.rate = 24000 if fmt else None
        _transcription(
            settings, session.get("input_audio_transcription"), "session.input_audio_transcription"
        )
        if "turn_detection" in session:
            settings.set_turn_detection = True
            settings.turn_detection = _turn_detection(session["turn_detection"], "session.turn_detection")
        return settings
    if session.get("type", "transcription") != "transcription":
        raise ProtocolError(
            "invalid_value", "voxrt serves transcription sessions only: set session.type to transcription"
        )
    audio_input = _object(_object(session.get("audio"), "session.audio").get("input"), "session.audio.input")
    if (fmt := audio_input.get("format")) is not None:
        fmt = _object(fmt, "session.audio.input.format")
        rate = fmt.get("rate", 24000)
        if fmt.get("type", "audio/pcm") != "audio/pcm" or rate not in INPUT_RATES:
            raise ProtocolError(
                "invalid_value", "session.audio.input.format: voxrt takes audio/pcm at 24000 (or 16000) Hz"
            )
        settings.rate = rate
    _transcription(settings, audio_input.get("transcription"), "session.audio.input.transcription")
    if "turn_detection" in audio_input:
        settings.set_turn_detection = True
        settings.turn_detection = _turn_detection(
            audio_input["turn_detection"], "session.audio.input.turn_detection"
        )
    return settings


def parse(message: str | bytes) -> tuple[Append | Commit | Clear | Update, str | None]:
    """A client event and its `event_id` (echoed in an error about it)."""
    event = load_event(message)
    kind, event_id = event["type"], event.get("event_id")
    event_id = event_id if isinstance(event_id, str) else None
    try:
        if kind == "input_audio_buffer.append":
            audio = event.get("audio")
            if not isinstance(audio, str):
                raise ProtocolError(
                    "invalid_event", "input_audio_buffer.append: missing string field 'audio'"
                )
            return Append(audio), event_id
        if kind == "input_audio_buffer.commit":
            return Commit(), event_id
        if kind == "input_audio_buffer.clear":
            return Clear(), event_id
        if kind in ("session.update", "transcription_session.update"):
            return Update(_settings(kind, _object(event.get("session"), "session"))), event_id
    except ProtocolError as exc:
        exc.event_id = event_id
        raise
    error = ProtocolError("invalid_event", f"Unknown or unsupported event type: {kind[:200]}")
    error.event_id = event_id
    raise error


def is_openai_event(message: str | bytes) -> bool:
    """An event only an OpenAI client sends: the first one picks the protocol when the URL did not."""
    try:
        event = json.loads(message)
    except (json.JSONDecodeError, RecursionError, TypeError, UnicodeDecodeError):
        return False
    if not isinstance(event, dict):
        return False
    return event.get("type") == "transcription_session.update" or (
        event.get("type") == "session.update" and isinstance(event.get("session"), dict)
    )


def dump(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, "event_id": new_id("event"), **fields}, ensure_ascii=False)


def session_object(
    session_id: str, model: str, rate: int, settings: TranscriptionSettings, vad: ServerVad | None
) -> dict:
    turn_detection = None
    if vad is not None:
        turn_detection = {"type": "server_vad", **vad.__dict__}
    return {
        "type": "transcription",
        "object": "realtime.transcription_session",
        "id": session_id,
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": rate},
                "transcription": {"model": model, "language": settings.language, "prompt": settings.prompt},
                "turn_detection": turn_detection,
                "noise_reduction": None,
            }
        },
        "include": [LOGPROBS] if settings.logprobs else [],
    }


def logprobs(words: list[TimedWord]) -> list[dict]:
    """The words' tokens as the openai SDK's `LogProbProperties`."""
    return [
        {"token": t.token, "logprob": round(t.logprob, 5), "bytes": list(t.bytes)}
        for word in words
        for t in word.tokens
    ]


def item_object(item_id: str, transcript: str | None) -> dict:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def error(code: str, message: str, event_id: str | None = None, server: bool = False) -> str:
    body = {
        "type": "server_error" if server else "invalid_request_error",
        "code": code,
        "message": message,
        "param": None,
        "event_id": event_id,
    }
    return dump("error", error=body)
