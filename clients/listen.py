"""A client of Deepgram's live wire (`/v1/listen`), for `voxrt stream --wire deepgram`: one
connection per recording, binary PCM16 frames paced like a microphone, then `CloseStream`;
its final results are the transcript, its interim ones the unstable tail."""

import asyncio
import json
import time
from collections.abc import Callable
from urllib.parse import urlencode, urlsplit, urlunsplit

from websockets.exceptions import InvalidStatus

from clients.audio import SAMPLE_RATE
from clients.connection import RETRY_SECONDS, StreamedUtterance, connect_retrying

LISTEN_PATH = "/v1/listen"


BYTES_PER_SAMPLE = {"linear16": 2, "mulaw": 1, "alaw": 1}


def listen_url(
    url: str, encoding: str, sample_rate: int, interim: bool, language: str | None, speakers: bool
) -> str:
    """The server's `/v1/listen` (whatever path `url` names) with the query for the audio."""
    query = {"encoding": encoding, "sample_rate": sample_rate, "interim_results": str(interim).lower()}
    if language:
        query["language"] = language
    if speakers:
        query["diarize"] = "true"
    scheme, host, *_ = urlsplit(url)
    return urlunsplit((scheme, host, LISTEN_PATH, urlencode(query), ""))


def _word(word: dict) -> dict:
    """A Deepgram word as the captions read one (vLLM's `words` shape)."""
    speaker = {"speaker": f"S{word['speaker'] + 1}"} if "speaker" in word else {}
    said = word.get("punctuated_word") or word["word"]
    return {
        "word": said,
        "start": word["start"],
        "end": word["end"],
        "probability": word["confidence"],
        **speaker,
    }


async def listen(
    url: str,
    data: bytes,
    encoding: str = "linear16",
    sample_rate: int = SAMPLE_RATE,
    api_key: str | None = None,
    chunk_ms: int = 100,
    speed: float = 1.0,
    on_message: Callable[[dict], None] | None = None,
    interim: bool = False,
    language: str | None = None,
    speakers: bool = False,
    retry_seconds: float = RETRY_SECONDS,
    on_refused: Callable[[InvalidStatus], None] | None = None,
) -> StreamedUtterance:
    """Stream `data` (audio in `encoding` at `sample_rate`) at `speed` x real time (0:
    unpaced), close the stream, and collect its results until `Metadata`: `done` is that
    message. A busy server's 503 is retried as `connect_retrying` does."""
    headers = {"Authorization": f"Token {api_key}"} if api_key else None
    result = StreamedUtterance()
    width = BYTES_PER_SAMPLE[encoding]
    per_second = sample_rate * width
    url = listen_url(url, encoding, sample_rate, interim, language, speakers)
    connection = await connect_retrying(url, headers, retry_seconds=retry_seconds, on_refused=on_refused)
    async with connection:

        async def send_all() -> None:
            chunk = sample_rate * chunk_ms // 1000 * width
            for offset in range(0, len(data), chunk):
                if speed > 0:
                    due = result.started_at + (offset + chunk) / per_second / speed
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                await connection.send(data[offset : offset + chunk])
            await connection.send(json.dumps({"type": "CloseStream"}))

        sender = asyncio.create_task(send_all())
        try:
            async for raw in connection:
                message = json.loads(raw)
                if on_message is not None:
                    on_message(message)
                seconds = time.monotonic() - result.started_at
                if message.get("type") == "Results":
                    alternative = message["channel"]["alternatives"][0]
                    text = alternative["transcript"]
                    if not message["is_final"]:
                        result.interims.append((seconds, text))
                    elif text:
                        delta = f" {text}" if result.text else text
                        result.deltas.append((seconds, delta))
                        result.text += delta
                        result.words += [_word(w) for w in alternative["words"]]
                elif message.get("type") == "Metadata":
                    result.done, result.done_at = message, seconds
                    break
                elif message.get("type") == "Error":
                    result.errors.append(
                        {"code": message.get("variant"), "error": message.get("description")}
                    )
            await sender
        finally:
            sender.cancel()
    return result
