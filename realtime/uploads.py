"""Uploaded recordings through the engine: each is an utterance like a live session's, its
audio decoded and handed over no faster than the engine consumes it, its events gathered into
one response or streamed as server-sent events."""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive

from realtime.audio_file import AudioFileError, Recording
from realtime.config import ServedModel
from realtime.door import retry_after
from realtime.engine.events import Delta, Done, EngineEvent, Failed, LanguageDetected
from realtime.engine.loop import Engine
from realtime.handles import Handles, UtteranceHandle
from realtime.metrics import Metrics
from realtime.progress import EngineProgress
from realtime.protocols import file_api
from realtime.protocols.common import ProtocolError, check_model
from realtime.protocols.file_api import FileRequest, UploadTranscript
from realtime.protocols.language_names import LANGUAGE_NAMES
from scheduler import RequestKind
from voxtral.audio import SAMPLE_RATE

log = structlog.get_logger("voxrt.uploads")

AHEAD_SECONDS = 30.0  # an upload's audio handed to the engine and not yet consumed
# How fast a form must arrive once its first seconds are past: far slower than a real client's
# link, fast enough that a client trickling bytes cannot hold its connection open for long.
MIN_BODY_BYTES_PER_SECOND = 8 << 10
BODY_GRACE_SECONDS = 5.0


class UploadRefused(Exception):
    """An upload not taken: its HTTP status and OpenAI error code."""

    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Job:
    """One upload's utterance: its engine events, and a block of its audio that does not decode."""

    events: asyncio.Queue[EngineEvent | AudioFileError] = field(default_factory=asyncio.Queue)
    handle: UtteranceHandle | None = None  # once in the engine

    def on_engine_event(self, utterance_id: str, event: EngineEvent) -> None:
        self.events.put_nowait(event)


class Uploads:
    """The uploads being transcribed, at most `max_uploads` at once."""

    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        model: ServedModel,
        handles: Handles,
        progress: EngineProgress,
        max_uploads: int,
    ) -> None:
        """`handles`: the server's table of utterances and where their events go."""
        self.engine, self.metrics, self.model, self.handles = engine, metrics, model, handles
        self.progress = progress
        self.max_uploads = max_uploads
        self.active = 0  # requests past the door, their forms being read or their audio transcribed
        self.transcribing = 0  # of those, the ones in the engine: what `max_uploads` bounds
        self.idle = asyncio.Event()  # no request active: a drain waits for it
        self.idle.set()
        self.num_uploads = 0

    async def answer(
        self, request: Request, task: str, max_bytes: int, refused: UploadRefused | None
    ) -> Response:
        """The transcript, or why not in OpenAI's error shape: a mistake ends this request alone."""
        try:
            if refused is not None:
                raise refused
            return await self._respond(request, task, max_bytes)
        except UploadRefused as exc:
            status, code, message = exc.status, exc.code, exc.message
        except (ProtocolError, AudioFileError) as exc:
            code = exc.code if isinstance(exc, ProtocolError) else "invalid_file"
            status, message = HTTPStatus.BAD_REQUEST, str(exc)
        self.metrics.errors.labels(code=code).inc()
        log.info("upload.refused", code=code, status=int(status))
        return file_api.error_response(status, code, message, retry_after(status))

    async def _respond(self, request: Request, task: str, max_bytes: int) -> Response:
        """The transcript (or translation) of the request's upload, in the format it asked.

        A form being read holds no seat, so a client that sends slowly keeps nobody else's
        upload waiting: the seats are checked at the door and again once the file is in."""
        self._check_seat()
        self._hold()
        try:
            asked = await self._parse(request, task, max_bytes)
            recording = await asyncio.to_thread(Recording, await asked.file.read())
            self._check_length(recording)
            self._check_seat()
        except BaseException:
            self._release()
            raise
        job = self._start(asked, recording)
        if asked.stream:
            return StreamingResponse(self._stream(asked, job, recording), media_type="text/event-stream")
        try:
            transcript = None
            async for event in self._run(asked, job, recording):
                if isinstance(event, UploadTranscript):
                    transcript = event
        finally:
            self._end(job)
        body = file_api.render(asked, task, transcript)
        return Response(body, media_type=file_api.MEDIA_TYPES[asked.response_format])

    async def _parse(self, request: Request, task: str, max_bytes: int) -> FileRequest:
        length = request.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise UploadRefused(
                HTTPStatus.LENGTH_REQUIRED, "length_required", "send the upload with its length"
            )
        if int(length) > max_bytes:
            raise UploadRefused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "file_too_large",
                f"the upload is {int(length) >> 20} MiB; at most {max_bytes >> 20} MiB (--max-upload-mb)",
            )
        try:
            paced = Request(request.scope, paced_receive(request.receive))
            form = await paced.form(max_files=1, max_fields=32)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError("invalid_request", f"the form cannot be read: {exc}") from None
        except HTTPException as exc:  # starlette's answer to a form past its bounds, as plain text
            raise ProtocolError("invalid_request", f"the form cannot be read: {exc.detail}") from None
        asked = file_api.parse(form, task, self.engine.spec)
        check_model(self.model, asked.model, log)
        return asked

    def _check_seat(self) -> None:
        if self.transcribing >= self.max_uploads:
            raise UploadRefused(
                HTTPStatus.TOO_MANY_REQUESTS,
                "too_many_uploads",
                f"{self.transcribing} uploads are being transcribed",
            )

    def _check_length(self, recording: Recording) -> None:
        """Refused before any of it is decoded; a header that says less meets the engine's own
        limit (`session_too_long`)."""
        limit = self.engine.config.max_session_seconds
        if recording.seconds > limit:
            raise UploadRefused(
                HTTPStatus.BAD_REQUEST,
                "audio_too_long",
                f"the recording is {recording.seconds:.0f} s long; this server takes {limit:g} s at most"
                " (--max-session-seconds)",
            )

    def _start(self, asked: FileRequest, recording: Recording) -> Job:
        self.num_uploads += 1
        self.transcribing += 1
        job = Job()
        utterance_id = f"upload-{self.num_uploads}-{time.monotonic_ns()}"
        job.handle = self.handles.open(
            utterance_id, job, transcription=asked.transcription, kind=RequestKind.UPLOAD
        )
        log.info("upload.start", utterance=utterance_id, seconds=round(recording.seconds, 3))
        return job

    def _hold(self) -> None:
        self.active += 1
        self.idle.clear()

    def _release(self) -> None:
        self.active -= 1
        if not self.active:
            self.idle.set()

    def _end(self, job: Job) -> None:
        job.handle.close()  # its rows leave the engine now, if the client left before its end
        self.transcribing -= 1
        self._release()

    async def _stream(self, asked: FileRequest, job: Job, recording: Recording) -> AsyncIterator[str]:
        try:
            async for event in self._run(asked, job, recording):
                if isinstance(event, UploadTranscript):
                    yield file_api.done_event(event, asked.logprobs)
                else:
                    yield file_api.delta_event(event.text, event.words if asked.logprobs else None)
        # The status is sent: the error goes as an event, as OpenAI's do.
        except UploadRefused as exc:
            yield f"data: {file_api.error_body(exc.code, exc.message, server=True)}\n"
        except AudioFileError as exc:
            yield f"data: {file_api.error_body('invalid_file', str(exc))}\n"
        finally:
            self._end(job)

    async def _run(
        self, asked: FileRequest, job: Job, recording: Recording
    ) -> AsyncIterator[Delta | UploadTranscript]:
        """The upload's deltas, then its transcript; its audio is fed meanwhile."""
        feeder = asyncio.create_task(self._feed(job, recording))
        # Named, or a one-language model's, or what the model detects (`LanguageDetected`).
        served = self.engine.spec.languages or frozenset()
        language = asked.transcription.language or (next(iter(served)) if len(served) == 1 else "")
        try:
            while True:
                event = await job.events.get()
                if isinstance(event, AudioFileError):
                    raise event
                if isinstance(event, LanguageDetected):
                    language = event.language
                elif isinstance(event, Delta) and event.text:
                    yield event
                elif isinstance(event, Failed):
                    raise UploadRefused(HTTPStatus.INTERNAL_SERVER_ERROR, event.code, event.message)
                elif isinstance(event, Done):
                    # Timed where the request asked for word times or speakers (`Utterance`).
                    name = LANGUAGE_NAMES.get(language, language)
                    yield UploadTranscript(event.text, event.words, event.audio_seconds, name)
                    return
        finally:
            feeder.cancel()

    async def _feed(self, job: Job, recording: Recording) -> None:
        """Its audio, a block at a time, while the engine holds less than `AHEAD_SECONDS` of it.

        Blocks are decoded on a worker thread, and the recording is never closed here: a
        cancelled feed leaves its read running there, and libsndfile's handle goes with the
        object once that read returns."""
        ahead, handle = round(AHEAD_SECONDS * SAMPLE_RATE), job.handle
        try:
            while len(block := await asyncio.to_thread(recording.read)):
                while handle.unconsumed_samples() > ahead:
                    await self.progress.wait()
                handle.add_audio(block)
        except AudioFileError as exc:
            job.events.put_nowait(exc)  # `_run` raises it: this upload alone ends
            return
        handle.finish()


def paced_receive(receive: Receive) -> Receive:
    """`receive` for a request body that must keep coming: `MIN_BODY_BYTES_PER_SECOND` of it for
    each second past the first `BODY_GRACE_SECONDS`. A client that falls behind gets 408, and
    its connection is closed with the rest of its body unread."""
    loop = asyncio.get_running_loop()
    start, received = loop.time(), 0

    async def paced() -> Message:
        nonlocal received
        deadline = start + BODY_GRACE_SECONDS + received / MIN_BODY_BYTES_PER_SECOND
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise UploadRefused(
                HTTPStatus.REQUEST_TIMEOUT,
                "upload_too_slow",
                f"the upload arrived slower than {MIN_BODY_BYTES_PER_SECOND >> 10} KiB a second",
            ) from None
        received += len(message.get("body", b""))
        return message

    return paced
