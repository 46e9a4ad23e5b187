"""OpenAI's file API, `POST /v1/audio/transcriptions` and `/translations`, as data: a request's
form parsed into what it asks, and a transcript written in the format it asked for."""

import itertools
import json
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus

from starlette.datastructures import FormData, UploadFile
from starlette.responses import Response

import captions
from realtime.protocols.common import (
    MAX_CODE_CHARS,
    MAX_NAME_CHARS,
    MAX_PROMPT_CHARS,
    ProtocolError,
    asked,
)
from realtime.protocols.openai_wire import logprobs
from voxtral.runner import ModelSpec, TimedWord, Transcription

FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "diarized_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


@dataclass(frozen=True)
class FileRequest:
    """What one upload asks for."""

    file: UploadFile
    model: str
    transcription: Transcription
    response_format: str
    stream: bool
    logprobs: bool  # `include[]=logprobs`
    words: bool  # `timestamp_granularities[]=word`: verbose_json carries `words`


def _field(form: FormData, name: str, limit: int) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProtocolError("invalid_value", f"{name}: must be a text field")
    if len(value) > limit:
        raise ProtocolError("invalid_value", f"{name}: at most {limit} characters")
    return value


def _flag(form: FormData, name: str) -> bool:
    value = (_field(form, name, MAX_CODE_CHARS) or "false").lower()
    if value not in ("true", "false"):
        raise ProtocolError("invalid_value", f"{name}: 'true' or 'false'")
    return value == "true"


def _list(form: FormData, name: str, limit: int = MAX_CODE_CHARS) -> list[str]:
    """A repeated field, as the openai SDK sends it (`include[]`), or named plainly."""
    values = form.getlist(f"{name}[]") + form.getlist(name)
    if any(not isinstance(v, str) or len(v) > limit for v in values):
        raise ProtocolError("invalid_value", f"{name}[]: text fields of at most {limit} characters")
    return values


def parse(form: FormData, task: str, spec: ModelSpec) -> FileRequest:
    """The form of an upload, or the `ProtocolError` that says what is wrong with it."""
    file = form.get("file")
    if not isinstance(file, UploadFile):
        raise ProtocolError("invalid_value", "file: a recording is required (multipart field 'file')")
    model = _field(form, "model", MAX_NAME_CHARS)
    if not model:
        raise ProtocolError("invalid_value", "model: required")
    response_format = _field(form, "response_format", MAX_CODE_CHARS) or "json"
    if response_format not in FORMATS:
        raise ProtocolError("invalid_value", f"response_format: one of {', '.join(FORMATS)}")
    temperature = _field(form, "temperature", MAX_CODE_CHARS)
    try:
        if temperature is not None and not 0 <= float(temperature) <= 1:
            raise ValueError
    except ValueError:
        raise ProtocolError("invalid_value", "temperature: a number from 0 to 1") from None
    include = _list(form, "include")
    if unknown := set(include) - {"logprobs"}:
        raise ProtocolError("invalid_value", f"include[]: unknown {sorted(unknown)[0]!r}; 'logprobs' is")
    granularities = _list(form, "timestamp_granularities")
    if unknown := set(granularities) - {"word", "segment"}:
        raise ProtocolError("invalid_value", f"timestamp_granularities[]: 'word' or 'segment', not {unknown}")
    stream = _flag(form, "stream")
    speakers = response_format == "diarized_json" or _flag(form, "diarize")
    wants_logprobs = "logprobs" in include
    words = "word" in granularities
    if words and response_format != "verbose_json":
        raise ProtocolError("invalid_value", "timestamp_granularities[]: needs response_format verbose_json")
    if stream and response_format not in ("json", "text"):
        raise ProtocolError("invalid_value", "stream: with response_format json or text")
    if stream and speakers:
        raise ProtocolError("invalid_value", "stream: not with speakers (diarized_json, diarize)")
    timed = spec.word_times and (words or wants_logprobs or response_format in ("srt", "vtt", "verbose_json"))
    transcription = asked(
        spec,
        language=_field(form, "language", MAX_CODE_CHARS) or None,
        task=task,
        prompt=_field(form, "prompt", MAX_PROMPT_CHARS),
        word_times=timed or wants_logprobs or words,
        speakers=speakers,
        keyterms=_list(form, "keyterms", MAX_NAME_CHARS),
    )
    return FileRequest(file, model, transcription, response_format, stream, wants_logprobs, words)


@dataclass
class UploadTranscript:
    """What the engine made of an upload."""

    text: str
    words: list[TimedWord] | None  # where the request needed them and the model times words
    seconds: float  # the audio's length
    language: str  # the name, as OpenAI's verbose_json gives it ("english")


def _word(word: TimedWord) -> dict:
    said = {"word": word.text, "start": round(word.start, 3), "end": round(word.end, 3)}
    return said if word.speaker is None else {**said, "speaker": word.speaker}


def _speaker_segments(words: list[TimedWord]) -> list[dict]:
    """OpenAI's diarized segments: each run of one speaker's words, timed from them."""
    runs = [list(run) for _, run in itertools.groupby(words, key=lambda w: w.speaker)]
    return [
        {
            "type": "transcript.text.segment",
            "id": f"seg_{i:03d}",
            "start": round(run[0].start, 3),
            "end": round(run[-1].end, 3),
            "text": " ".join(w.text for w in run),
            "speaker": run[0].speaker,
        }
        for i, run in enumerate(runs)
    ]


def _segments(transcript: UploadTranscript) -> list[dict]:
    """Whisper-style segments: a sentence (or a turn) each, from the words' times; the whole
    transcript as one segment when the model times no words."""
    if transcript.words is None:
        spans = [(0.0, transcript.seconds, transcript.text, [])]
    else:
        spans, at = [], 0
        for cue in captions.cues([_word(w) for w in transcript.words]):
            count = len(" ".join(cue.lines).split())
            words, at = transcript.words[at : at + count], at + count
            spans.append((cue.start, cue.end, " ".join(cue.lines), words))
    segments = []
    for i, (start, end, text, words) in enumerate(spans):
        tokens = [t.logprob for w in words for t in w.tokens]
        encoded = text.encode()
        segments.append(
            {
                "id": i,
                "seek": 0,
                "start": round(start, 3),
                "end": round(end, 3),
                "text": " " + text,
                "tokens": [],  # token ids are the model's own: the text is what this API returns
                "temperature": 0.0,
                "avg_logprob": round(sum(tokens) / len(tokens), 5) if tokens else 0.0,
                "compression_ratio": round(len(encoded) / len(zlib.compress(encoded)), 5) if encoded else 0.0,
                "no_speech_prob": 0.0,
            }
        )
    return segments


def usage(transcript: UploadTranscript) -> dict:
    return {"type": "duration", "seconds": math.ceil(transcript.seconds)}


def render(request: FileRequest, task: str, transcript: UploadTranscript) -> str:
    """The transcript as the request's `response_format`."""
    fmt = request.response_format
    if fmt == "text" and request.transcription.speakers:  # a line per turn, its speaker named
        return captions.render(fmt, transcript.text, [_word(w) for w in transcript.words or []])
    if fmt == "text":
        return transcript.text + "\n"
    if fmt in ("srt", "vtt"):
        words = [_word(w) for w in transcript.words or []]
        if transcript.words is None and transcript.text:  # no word times: one caption of it all
            words = [{"word": transcript.text, "start": 0.0, "end": transcript.seconds}]
        return captions.render(fmt, transcript.text, words)
    body: dict = {"text": transcript.text}
    if fmt == "diarized_json":
        body = {
            "task": task,
            "duration": round(transcript.seconds, 3),
            "text": transcript.text,
            "segments": _speaker_segments(transcript.words or []),
        }
    if fmt == "verbose_json":
        body = {
            "task": task,
            "language": transcript.language,
            "duration": round(transcript.seconds, 3),
            "text": transcript.text,
            "segments": _segments(transcript),
        }
        if request.words and transcript.words is not None:
            body["words"] = [_word(w) for w in transcript.words]
    if request.logprobs and transcript.words is not None:
        body["logprobs"] = logprobs(transcript.words)
    body["usage"] = usage(transcript)
    return json.dumps(body, ensure_ascii=False)


def delta_event(text: str, words: list[TimedWord] | None) -> str:
    """A `transcript.text.delta` server-sent event."""
    event: dict = {"type": "transcript.text.delta", "delta": text}
    if words is not None:
        event["logprobs"] = logprobs(words)
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


def done_event(transcript: UploadTranscript, with_logprobs: bool) -> str:
    event: dict = {"type": "transcript.text.done", "text": transcript.text}
    if with_logprobs and transcript.words is not None:
        event["logprobs"] = logprobs(transcript.words)
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


def error_body(code: str, message: str, server: bool = False) -> str:
    """OpenAI's HTTP error shape."""
    kind = "server_error" if server else "invalid_request_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}) + "\n"


def error_response(
    status: HTTPStatus, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """OpenAI's HTTP error as a response: every error this server answers over plain HTTP."""
    body = error_body(code, message, server=status >= HTTPStatus.INTERNAL_SERVER_ERROR)
    return Response(body, status, headers, media_type="application/json")
