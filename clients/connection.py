"""A client of the realtime protocol: connect, stream paced audio, collect the server's events."""

import asyncio
import base64
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.protocol import State

from clients.audio import SAMPLE_RATE, float32_to_pcm16

# Error codes after which the server sends no `transcription.done` for the utterance.
UTTERANCE_ENDING_ERRORS = {"session_too_long", "processing_error", "slow_consumer", "server_overloaded"}
RETRY_SECONDS = 120.0  # how long the clients keep retrying a busy server, by default


class ServerError(Exception):
    def __init__(self, event: dict) -> None:
        super().__init__(f"{event.get('code')}: {event.get('error')}")
        self.event = event


@dataclass
class StreamedUtterance:
    """What the server said about one streamed utterance."""

    text: str = ""
    # `time.monotonic()` at its start: every timestamp below counts from it.
    started_at: float = field(default_factory=time.monotonic)
    deltas: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, delta)
    # (seconds since start, the unstable tail after `text`), when asked for with `interim`
    interims: list[tuple[float, str]] = field(default_factory=list)
    done: dict | None = None
    done_at: float | None = None  # seconds since start when `transcription.done` arrived
    words: list[dict] = field(default_factory=list)  # timed words, when asked for (`done`'s)
    errors: list[dict] = field(default_factory=list)


def retry_delay(retry_after: str | None, attempt: int) -> float:
    """What the server asked for (`Retry-After` seconds; 1 s if it did not say), doubled with
    every refusal in a row up to 30 s, and up to half again at random so that the clients a
    busy server refused together do not all come back together."""
    try:
        asked = max(0.0, float(retry_after)) if retry_after is not None else 1.0
    except ValueError:
        asked = 1.0
    return max(asked, min(30.0, asked * 2**attempt)) * random.uniform(1.0, 1.5)


async def connect_retrying(
    url: str,
    headers: dict[str, str] | None,
    open_timeout: float = 10,
    retry_seconds: float = 0.0,
    on_refused: Callable[[InvalidStatus], None] | None = None,
) -> ClientConnection:
    """A WebSocket to `url`. A 503 (busy or draining) is retried after its `Retry-After` for up
    to `retry_seconds`; `on_refused` hears of each refusal retried."""
    deadline, refusals = time.monotonic() + retry_seconds, 0
    while True:
        try:
            return await connect(url, additional_headers=headers, open_timeout=open_timeout, max_size=None)
        except InvalidStatus as exc:
            delay = retry_delay(exc.response.headers.get("Retry-After"), refusals)
            if exc.response.status_code != 503 or time.monotonic() + delay > deadline:
                raise
            if on_refused is not None:
                on_refused(exc)
            refusals += 1
            await asyncio.sleep(delay)


async def open_connection(
    url: str,
    api_key: str | None = None,
    open_timeout: float = 10,
    retry_seconds: float = 0.0,
    on_refused: Callable[[InvalidStatus], None] | None = None,
) -> ClientConnection:
    """Connect (retrying a 503 as `connect_retrying` does) and read `session.created`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    connection = await connect_retrying(url, headers, open_timeout, retry_seconds, on_refused)
    created = json.loads(await connection.recv())
    if created.get("type") != "session.created":
        raise ServerError(created)
    return connection


async def reopened(
    connection: ClientConnection | None,
    url: str,
    api_key: str | None = None,
    retry_seconds: float = RETRY_SECONDS,
    on_refused: Callable[[InvalidStatus], None] | None = None,
) -> ClientConnection:
    """`connection` while it is open; else a new one. Between utterances: a server that
    drains closes with 1001 once its running utterances are done, and the next goes elsewhere."""
    if connection is not None and connection.state is State.OPEN:
        return connection
    if connection is not None:
        await connection.close()
    return await open_connection(url, api_key, retry_seconds=retry_seconds, on_refused=on_refused)


async def send_audio(connection: ClientConnection, samples: np.ndarray) -> None:
    audio = base64.b64encode(float32_to_pcm16(samples)).decode()
    await connection.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))


async def commit(connection: ClientConnection, final: bool = False) -> None:
    event = {"type": "input_audio_buffer.commit"}
    if final:
        event["final"] = True
    await connection.send(json.dumps(event))


async def update_session(
    connection: ClientConnection,
    interim: bool,
    language: str | None,
    word_timestamps: bool = False,
    speakers: bool = False,
) -> None:
    """voxrt's session.update extensions, sent only when asked for (a plain vLLM session has none)."""
    settings: dict = {"interim": True} if interim else {}
    if language:
        settings["language"] = language
    if word_timestamps:
        settings["word_timestamps"] = True
    if speakers:
        settings["diarize"] = True
    if settings:
        await connection.send(json.dumps({"type": "session.update", **settings}))


async def stream_utterance(
    connection: ClientConnection,
    samples: np.ndarray,
    chunk_ms: int = 100,
    speed: float = 1.0,
    on_event: Callable[[dict], None] | None = None,
    interim: bool = False,
    language: str | None = None,
    word_timestamps: bool = False,
    speakers: bool = False,
) -> StreamedUtterance:
    """Stream `samples` paced at `speed` x real time (0: as fast as possible), then wait for done.

    Paced like a microphone: a chunk is sent once it has been captured, so time 0 (the
    start of every timestamp in the result) is when the first sample was heard. `interim`,
    `language` (for a multilingual model; None: it detects), `word_timestamps` and `speakers`
    (each word's speaker) are asked for first.
    """
    result = StreamedUtterance()
    started = result.started_at

    async def send_all() -> None:
        await update_session(connection, interim, language, word_timestamps, speakers)
        await commit(connection)
        chunk = int(SAMPLE_RATE * chunk_ms / 1000)
        for offset in range(0, len(samples), chunk):
            if speed > 0:
                due = started + (offset + chunk) / SAMPLE_RATE / speed
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            await send_audio(connection, samples[offset : offset + chunk])
        await commit(connection, final=True)

    sender = asyncio.create_task(send_all())
    try:
        async for message in connection:
            event = json.loads(message)
            if on_event is not None:
                on_event(event)
            kind = event.get("type")
            if kind == "transcription.delta":
                result.deltas.append((time.monotonic() - started, event["delta"]))
                result.text += event["delta"]
            elif kind == "transcription.interim":
                result.interims.append((time.monotonic() - started, event["text"]))
            elif kind == "transcription.done":
                result.done, result.done_at = event, time.monotonic() - started
                result.text = event["text"]
                result.words = event.get("words", [])
                break
            elif kind == "error":
                result.errors.append(event)
                if event.get("code") in UTTERANCE_ENDING_ERRORS:
                    break
        ended = result.done is not None or any(
            e.get("code") in UTTERANCE_ENDING_ERRORS for e in result.errors
        )
        if not ended:  # the connection closed first: the sender's failure, if any, says why
            await sender
        # Else the server ended it: the sender is done, or (a drain, a shed) its audio is moot.
    finally:
        sender.cancel()
    return result
