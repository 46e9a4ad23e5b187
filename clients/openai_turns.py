"""One recording on OpenAI's Realtime wire, as a voice agent streams it: a transcription
session whose turns the server's VAD ends, 24 kHz PCM16 paced in real time, then every item
the server committed until it completes."""

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from clients.connection import send_audio

RATE = 24000  # what OpenAI's wire carries: `audio/pcm` at 24 kHz
TRAILING_SILENCE_SECONDS = 1.0  # after the recording: the VAD hears its last turn end
COMPLETION_TIMEOUT_SECONDS = 60.0


@dataclass
class Turns:
    """What the server said about one recording: its items' transcripts, in order."""

    transcripts: list[str] = field(default_factory=list)
    deltas: int = 0
    errors: list[dict] = field(default_factory=list)  # each error event's `error` object
    done: bool = False  # every committed item completed


def session_update() -> str:
    session = {
        "type": "transcription",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": {"type": "server_vad"}}
        },
    }
    return json.dumps({"type": "session.update", "session": session})


async def stream_turns(
    connection: ClientConnection, samples: np.ndarray, chunk_ms: int, speed: float
) -> Turns:
    """Stream `samples` (24 kHz) paced at `speed` x real time, then a second of silence; a turn
    the VAD has not ended by then is committed by hand. Returns once every committed item has
    completed, or once the server closed the session after an error event (a shed)."""
    result = Turns()
    committed: set[str] = set()
    completed: set[str] = set()
    speaking = False  # a turn started and not committed
    sent = asyncio.Event()

    async def send_all() -> None:
        await connection.send(session_update())
        audio = np.concatenate([samples, np.zeros(int(TRAILING_SILENCE_SECONDS * RATE), np.float32)])
        chunk, started = RATE * chunk_ms // 1000, time.monotonic()
        for offset in range(0, len(audio), chunk):
            await asyncio.sleep(max(0.0, started + (offset + chunk) / RATE / speed - time.monotonic()))
            await send_audio(connection, audio[offset : offset + chunk])  # the same event as vLLM's
        if speaking:
            await connection.send(json.dumps({"type": "input_audio_buffer.commit"}))
        sent.set()

    sender = asyncio.create_task(send_all())
    deadline = time.monotonic() + len(samples) / RATE / speed + COMPLETION_TIMEOUT_SECONDS
    try:
        while not (sent.is_set() and not speaking and completed >= committed):
            if time.monotonic() > deadline:
                result.errors.append({"code": "timeout", "message": "items committed and never completed"})
                return result
            try:  # a bounded wait: the last item may complete before the last audio is sent
                event = json.loads(await asyncio.wait_for(connection.recv(), 0.25))
            except TimeoutError:
                continue
            kind = event.get("type")
            if kind == "input_audio_buffer.speech_started":
                speaking = True
            elif kind == "input_audio_buffer.committed":
                speaking = False
                committed.add(event["item_id"])
            elif kind == "conversation.item.input_audio_transcription.delta":
                result.deltas += 1
            elif kind == "conversation.item.input_audio_transcription.completed":
                completed.add(event["item_id"])
                result.transcripts.append(event["transcript"])
            elif kind == "error":
                result.errors.append(event.get("error", {}))
        result.done = True
    except ConnectionClosed:
        if not result.errors:  # closed without a word: the caller's to handle
            raise
    finally:
        sender.cancel()
    return result
