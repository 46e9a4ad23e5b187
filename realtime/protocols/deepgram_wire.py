"""Deepgram's live transcription protocol on the wire (`/v1/listen`): its query parameters read,
its control messages parsed, its messages built.

Shapes follow Deepgram's Python SDK (`deepgram.listen.v1`: `ListenV1Results`,
`ListenV1UtteranceEnd`, `ListenV1SpeechStarted`, `ListenV1Metadata`, `ListenV1Error`).
"""

import json
import re
import string
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from realtime.protocols.common import MAX_CODE_CHARS, MAX_KEYTERMS, MAX_NAME_CHARS, ProtocolError, asked
from voxtral.audio import Encoding
from voxtral.runner import ModelSpec, TimedWord, Transcription
from voxtral.vad import VadConfig

ENCODINGS: dict[str, Encoding] = {"linear16": "pcm16", "mulaw": "mulaw", "alaw": "alaw"}
# The shortest pause that ends a turn: Silero's frames are 32 ms and a turn ended at every
# breath would cut Whisper's windows mid-sentence. Deepgram's own default (10 ms) is taken as this.
MIN_ENDPOINTING_MS = 300
MIN_UTTERANCE_END_MS = 1000  # Deepgram's floor: shorter gaps are refused
EOT_TIMEOUT_MS = 5000  # Flux's default: a pause heard as mid-sentence ends the turn after this
MAX_MS = 60_000
CHANNEL_INDEX = [0, 1]  # the first of one channel
MODEL_VERSION = "voxrt"


@dataclass(frozen=True)
class ListenOptions:
    """What a client asked for in `/v1/listen`'s query."""

    encoding: Encoding
    sample_rate: int
    model: str | None = None
    language: str | None = None  # None: the served model's, or detected (`multi`)
    interim_results: bool = False
    endpointing_ms: int | None = MIN_ENDPOINTING_MS  # None: `endpointing=false`
    utterance_end_ms: int | None = None
    vad_events: bool = False
    diarize: bool = False
    keyterms: tuple[str, ...] = ()  # `keyterm` and `keywords` (their boosts dropped)
    tags: tuple[str, ...] = ()
    # voxrt's extension, named as Deepgram's Flux names its own: an endpointing pause ends the
    # turn where the turn model hears it complete with this probability, else after the timeout.
    eot_threshold: float | None = None
    eot_timeout_ms: int = EOT_TIMEOUT_MS

    def vad(self) -> VadConfig | None:
        """The VAD the turns need: for `speech_final`, `UtteranceEnd` or `SpeechStarted`."""
        if self.endpointing_ms is None and self.utterance_end_ms is None and not self.vad_events:
            return None
        silence = self.endpointing_ms or VadConfig.silence_ms
        if self.eot_threshold is None or self.endpointing_ms is None:
            return VadConfig(silence_ms=silence)
        return VadConfig(
            silence_ms=silence, complete_at=self.eot_threshold, max_silence_ms=self.eot_timeout_ms
        )

    def transcription(self, spec: ModelSpec) -> Transcription:
        """What the session asks of the served model (words always come timed, where it times
        them: Deepgram's results carry them), or the error naming what it supports."""
        return asked(
            spec,
            language=self.language,
            word_times=spec.word_times,
            speakers=self.diarize,
            keyterms=self.keyterms,
        )


def _flag(query: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = query.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ProtocolError("Bad Request", f"{name}={value[:50]!r}: expected true or false")
    return value.lower() == "true"


def _integer(query: Mapping[str, str], name: str, least: int, most: int) -> int | None:
    value = query.get(name)
    if value is None:
        return None
    if not value.isdigit() or not least <= int(value) <= most:
        raise ProtocolError("Bad Request", f"{name}={value[:50]!r}: expected an integer in [{least}, {most}]")
    return int(value)


def listen_options(query: Mapping[str, str], all_values: Mapping[str, list[str]]) -> ListenOptions:
    """The query's options, or the `ProtocolError` (answered with HTTP 400) saying which is wrong.
    `all_values`: each parameter's every value (`keyterm` and `keywords` repeat)."""
    encoding = query.get("encoding")
    if encoding is None:
        raise ProtocolError(
            "Bad Request", "encoding is required: linear16, mulaw or alaw (containers are not read)"
        )
    if encoding not in ENCODINGS:
        raise ProtocolError("Bad Request", f"encoding={encoding[:50]!r}: choose linear16, mulaw or alaw")
    sample_rate = _integer(query, "sample_rate", 8000, 48000)
    if sample_rate is None:
        raise ProtocolError("Bad Request", "sample_rate is required with encoding")
    if query.get("channels", "1") != "1" or _flag(query, "multichannel"):
        raise ProtocolError("Bad Request", "one channel only: channels=1")
    endpointing: int | None = MIN_ENDPOINTING_MS
    if query.get("endpointing", "").lower() == "false":
        endpointing = None
    elif (asked := _integer(query, "endpointing", 0, MAX_MS)) is not None:
        endpointing = max(asked, MIN_ENDPOINTING_MS)
    interim = _flag(query, "interim_results")
    utterance_end = _integer(query, "utterance_end_ms", MIN_UTTERANCE_END_MS, MAX_MS)
    if utterance_end is not None and not interim:
        raise ProtocolError("Bad Request", "utterance_end_ms needs interim_results=true")
    language = query.get("language")
    if language is not None:
        language = None if language == "multi" else language.split("-")[0][:MAX_CODE_CHARS]
    terms = all_values.get("keyterm", []) + [k.rsplit(":", 1)[0] for k in all_values.get("keywords", [])]
    eot_threshold = None
    if (asked := query.get("eot_threshold")) is not None:
        try:
            eot_threshold = float(asked)
        except ValueError:
            eot_threshold = -1.0
        if not 0.0 <= eot_threshold <= 1.0:
            raise ProtocolError("Bad Request", f"eot_threshold={asked[:50]!r}: expected a number in [0, 1]")
    eot_timeout = _integer(query, "eot_timeout_ms", MIN_ENDPOINTING_MS, MAX_MS)
    for name in ("punctuate", "smart_format", "vad_events", "diarize", "numerals", "profanity_filter"):
        _flag(query, name)  # each must be a boolean; punctuation and formatting are Whisper's own
    return ListenOptions(
        encoding=ENCODINGS[encoding],
        sample_rate=sample_rate,
        model=(query.get("model") or None) and query["model"][:MAX_NAME_CHARS],
        language=language,
        interim_results=interim,
        endpointing_ms=endpointing,
        utterance_end_ms=utterance_end,
        vad_events=_flag(query, "vad_events"),
        diarize=_flag(query, "diarize") or "diarize_model" in query,
        keyterms=tuple(t[:MAX_NAME_CHARS] for t in terms[:MAX_KEYTERMS]),
        tags=tuple(t[:MAX_NAME_CHARS] for t in all_values.get("tag", [])),
        eot_threshold=eot_threshold,
        eot_timeout_ms=eot_timeout or EOT_TIMEOUT_MS,
    )


CONTROLS = ("KeepAlive", "Finalize", "CloseStream")


def control(message: str) -> str:
    """A text message's type, one of `CONTROLS`; `ProtocolError` for anything else."""
    try:
        event = json.loads(message)
    except (json.JSONDecodeError, RecursionError):
        event = None
    if not isinstance(event, dict) or event.get("type") not in CONTROLS:
        raise ProtocolError("SchemaError", f"expected a JSON object of type {', '.join(CONTROLS)}")
    return event["type"]


def new_request_id() -> str:
    return str(uuid.uuid4())


@dataclass
class Metadata:
    """What a session's `Results` and its closing `Metadata` say about it."""

    request_id: str = field(default_factory=new_request_id)
    model_uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    model_name: str = ""
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat().replace("+00:00", "Z"))

    def model_info(self) -> dict:
        return {"name": self.model_name, "version": MODEL_VERSION, "arch": self.model_name}


_EDGES = string.punctuation + "¿¡“”‘’«»…"


def _word(word: TimedWord, offset: float, speakers: bool) -> dict:
    said = word.text.strip()
    bare = said.strip(_EDGES).lower() or said.lower()
    out = {
        "word": bare,
        "start": round(offset + word.start, 3),
        "end": round(offset + word.end, 3),
        "confidence": round(word.probability, 4),
        "punctuated_word": said,
    }
    if speakers and word.speaker is not None:
        out["speaker"] = int(re.sub(r"\D", "", word.speaker) or 1) - 1  # "S1" is speaker 0
    return out


def results(
    meta: Metadata,
    start: float,
    end: float,
    transcript: str,
    words: list[TimedWord],
    offset: float,
    is_final: bool,
    speech_final: bool = False,
    from_finalize: bool = False,
    speakers: bool = False,
) -> str:
    """Text for the audio from `start` to `end` (seconds of the session); `words` on the
    utterance's audio, which begins at `offset`."""
    confidence = sum(w.probability for w in words) / len(words) if words else 0.0
    body = {
        "type": "Results",
        "channel_index": CHANNEL_INDEX,
        "duration": round(max(0.0, end - start), 3),
        "start": round(start, 3),
        "is_final": is_final,
        "speech_final": speech_final,
        "channel": {
            "alternatives": [
                {
                    "transcript": transcript.strip(),
                    "confidence": round(confidence, 4),
                    "words": [_word(w, offset, speakers) for w in words],
                }
            ]
        },
        "metadata": {
            "request_id": meta.request_id,
            "model_info": meta.model_info(),
            "model_uuid": meta.model_uuid,
        },
        "from_finalize": from_finalize,
    }
    return json.dumps(body, ensure_ascii=False)


def speech_started(at: float) -> str:
    return json.dumps({"type": "SpeechStarted", "channel": CHANNEL_INDEX, "timestamp": round(at, 3)})


def utterance_end(last_word_end: float) -> str:
    body = {"type": "UtteranceEnd", "channel": CHANNEL_INDEX, "last_word_end": round(last_word_end, 3)}
    return json.dumps(body)


def metadata(meta: Metadata, duration: float, sha256: str) -> str:
    return json.dumps(
        {
            "type": "Metadata",
            "transaction_key": "deprecated",
            "request_id": meta.request_id,
            "sha256": sha256,
            "created": meta.created,
            "duration": round(duration, 3),
            "channels": 1,
            "models": [meta.model_uuid],
            "model_info": {meta.model_uuid: meta.model_info()},
        }
    )


def error(variant: str, description: str, message: str | None = None) -> str:
    body = {"type": "Error", "variant": variant, "description": description}
    if message is not None:
        body["message"] = message
    return json.dumps(body, ensure_ascii=False)


# voxrt's refusals that Deepgram names its own way, with its words.
REFUSALS = {"invalid_api_key": ("INVALID_AUTH", "Invalid credentials.")}


def refusal_body(code: str, message: str, request_id: str) -> dict:
    """A refused upgrade's HTTP body, as Deepgram's REST errors read."""
    code, message = REFUSALS.get(code, (code, message))
    return {"err_code": code, "err_msg": message, "request_id": request_id}
