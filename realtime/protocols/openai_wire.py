"""OpenAI's Realtime transcription protocol on the wire: its client events read, its server events built.

Shapes follow the openai Python SDK's `types/realtime` (GA `session.update` with a
`transcription` session) and the older beta `transcription_session.update`.
"""

import json
import uuid
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, get_args

from pydantic import Field, model_validator

from realtime.protocols.common import Base64, Code, Keyterms, Name, Prompt, WireObject, parse_event
from voxtral.audio import Encoding
from voxtral.g711 import RATE as G711_RATE
from voxtral.runner import TimedWord
from voxtral.vad import VadConfig

Include = list[Literal["item.input_audio_transcription.logprobs"]]  # the one a transcription session has
LOGPROBS: str = get_args(get_args(Include)[0])[0]


class ServerVad(WireObject):
    type: Literal["server_vad"] = "server_vad"
    threshold: Annotated[float, Field(ge=0, le=1)] = 0.5
    prefix_padding_ms: Annotated[int, Field(ge=0, le=10_000)] = 300
    silence_duration_ms: Annotated[int, Field(ge=0, le=10_000)] = 500

    def vad_config(self) -> VadConfig:
        return VadConfig(threshold=self.threshold, silence_ms=self.silence_duration_ms)


# semantic_vad's eagerness: how sure the turn model must be that a pause ends the turn, and how
# long a pause it hears as mid-sentence may last (OpenAI's timeouts: 8, 4 and 2 s).
EAGERNESS = {"low": (0.8, 8000), "medium": (0.5, 4000), "auto": (0.5, 4000), "high": (0.3, 2000)}
SEMANTIC_PAUSE_MS = 300  # a pause this long is judged


class SemanticVad(WireObject):
    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    prefix_padding_ms: ClassVar[int] = 300  # semantic_vad has no padding to set: server_vad's default

    def vad_config(self) -> VadConfig:
        complete_at, longest = EAGERNESS[self.eagerness]
        return VadConfig(silence_ms=SEMANTIC_PAUSE_MS, complete_at=complete_at, max_silence_ms=longest)


TurnDetection = Annotated[ServerVad | SemanticVad, Field(union_mode="left_to_right")]


# Each format's coding; G.711's (a phone line's) is always 8 kHz.
ENCODINGS: dict[str, Encoding] = {"audio/pcm": "pcm16", "audio/pcmu": "mulaw", "audio/pcma": "alaw"}
BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


@dataclass(frozen=True)
class InputFormat:
    """How the session's audio comes: its coding and rate."""

    type: str = "audio/pcm"
    rate: int = 24000

    @property
    def encoding(self) -> Encoding:
        return ENCODINGS[self.type]

    def wire(self) -> dict:
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}


class AudioFormat(WireObject):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    # OpenAI's PCM is 24 kHz (16 kHz is voxrt's extension); G.711 is 8 kHz.
    rate: Literal[24000, 16000, 8000] | None = None

    @model_validator(mode="after")
    def _rate_of_its_type(self) -> "AudioFormat":
        allowed = (24000, 16000) if self.type == "audio/pcm" else (G711_RATE,)
        if self.rate is not None and self.rate not in allowed:
            rates = " or ".join(map(str, allowed))
            raise ValueError(f"{self.type} is sampled at {rates} Hz, not {self.rate}")
        return self

    def input_format(self) -> InputFormat:
        default = 24000 if self.type == "audio/pcm" else G711_RATE
        return InputFormat(self.type, self.rate or default)


class InputTranscription(WireObject):
    model: Name | None = None
    language: Code | None = None
    prompt: Prompt | None = None
    keyterms: Keyterms | None = None  # voxrt's extension: words to expect (names, terms)


class AudioInput(WireObject):
    format: AudioFormat | None = None
    transcription: InputTranscription | None = None
    turn_detection: TurnDetection | None = None  # null turns it off; absent leaves it as it is


class Audio(WireObject):
    input: AudioInput | None = None


@dataclass
class TranscriptionSettings:
    """What a transcription session sets; None where an update leaves a field as it is."""

    format: InputFormat | None = None
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    turn_detection: TurnDetection | None = None
    set_turn_detection: bool = False  # the update names turn_detection (null turns it off)
    logprobs: bool | None = None  # `include` names LOGPROBS: deltas and completed carry them
    keyterms: list[str] | None = None


class Session(WireObject):
    """`session.update`'s session (the GA form)."""

    type: Literal["transcription"] = "transcription"  # voxrt serves transcription sessions only
    audio: Audio | None = None
    include: Include | None = None

    def settings(self) -> TranscriptionSettings:
        audio_input = (self.audio and self.audio.input) or AudioInput()
        audio_format = audio_input.format.input_format() if audio_input.format else None
        return _settings(audio_format, audio_input.transcription, audio_input, self.include)


class BetaSession(WireObject):
    """`transcription_session.update`'s session (the older beta form)."""

    input_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None
    input_audio_transcription: InputTranscription | None = None
    turn_detection: TurnDetection | None = None
    include: Include | None = None

    def settings(self) -> TranscriptionSettings:
        audio_format = None
        if self.input_audio_format is not None:
            audio_format = AudioFormat(type=BETA_FORMATS[self.input_audio_format]).input_format()
        return _settings(audio_format, self.input_audio_transcription, self, self.include)


def _settings(
    audio_format: InputFormat | None,
    transcription: InputTranscription | None,
    turns: AudioInput | BetaSession,
    include: Include | None,
) -> TranscriptionSettings:
    """The settings an update names; `turns` holds its turn_detection, named or not."""
    transcription = transcription or InputTranscription()
    return TranscriptionSettings(
        format=audio_format,
        model=transcription.model,
        language=transcription.language,
        prompt=transcription.prompt,
        turn_detection=turns.turn_detection,
        set_turn_detection="turn_detection" in turns.model_fields_set,
        logprobs=None if include is None else bool(include),
        keyterms=transcription.keyterms,
    )


class OpenAIEvent(WireObject):
    event_id: Name | None = None  # the client's, echoed in an error about the event


class Append(OpenAIEvent):
    audio: Base64  # in the session's format


class Commit(OpenAIEvent):
    pass


class Clear(OpenAIEvent):
    pass


class Update(OpenAIEvent):
    session: Session = Session()


class BetaUpdate(OpenAIEvent):
    session: BetaSession = BetaSession()


EVENTS = {
    "input_audio_buffer.append": Append,
    "input_audio_buffer.commit": Commit,
    "input_audio_buffer.clear": Clear,
    "session.update": Update,
    "transcription_session.update": BetaUpdate,
}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def parse(message: str | bytes) -> OpenAIEvent:
    return parse_event(message, EVENTS, "invalid_event")


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
    session_id: str,
    model: str,
    audio_format: InputFormat,
    settings: TranscriptionSettings,
    vad: ServerVad | SemanticVad | None,
) -> dict:
    turn_detection = None
    if vad is not None:
        turn_detection = vad.model_dump()
    transcription = {"model": model, "language": settings.language, "prompt": settings.prompt}
    if settings.keyterms is not None:
        transcription["keyterms"] = settings.keyterms
    return {
        "type": "transcription",
        "object": "realtime.transcription_session",
        "id": session_id,
        "audio": {
            "input": {
                "format": audio_format.wire(),
                "transcription": transcription,
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
