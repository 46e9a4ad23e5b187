"""`voxrt mic`: transcribe the microphone live; Ctrl-C finishes the utterance and prints it."""

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from websockets.exceptions import InvalidHandshake, InvalidStatus, WebSocketException

from captions import render
from clients.audio import SAMPLE_RATE, UnreadableAudio, load_audio_file
from clients.connection import RETRY_SECONDS, ServerError, commit, reopened, send_audio, update_session
from clients.stream import (
    DEFAULT_URL,
    EXIT_CONNECTION,
    EXIT_OK,
    EXIT_SERVER_ERROR,
    EXIT_USAGE,
    refusal_notice,
)

CHUNK = SAMPLE_RATE // 10  # 100 ms
CLOSE_WAIT_SECONDS = 15.0  # a draining server closes after its running utterances are done
PORTAUDIO_HINT = (
    "voxrt mic: PortAudio is missing: install it (Debian/Ubuntu: sudo apt-get install libportaudio2; "
    "macOS: brew install portaudio), or use --input-file"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--device", type=int, default=None, help="input device index (see --list-devices)")
    parser.add_argument("--list-devices", action="store_true")
    parser.add_argument("--input-file", default=None, help="play a file as if it were the microphone")
    parser.add_argument(
        "--language", default=None, help="e.g. fr, for a multilingual model (default: detected)"
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--retry-seconds", type=float, default=RETRY_SECONDS, help="retry a busy server this long"
    )
    parser.add_argument(
        "--speakers", action="store_true", help="label who said each word in what --save writes"
    )
    parser.add_argument(
        "--save",
        default=None,
        metavar="FILE",
        help="write the transcript at the end: captions for FILE.srt or FILE.vtt, text and timed words "
        "for FILE.json, else text",
    )


def _sounddevice():
    try:
        import sounddevice
    except OSError:  # the module imports, then fails to find libportaudio
        print(PORTAUDIO_HINT, file=sys.stderr)
        return None
    return sounddevice


def _level_db(samples: np.ndarray) -> float:
    return 20 * np.log10(max(1e-5, float(np.sqrt(np.mean(samples**2))) if len(samples) else 1e-5))


DIM, PLAIN = "\x1b[2m", "\x1b[0m"


class Display:
    """Committed text, and on a terminal a live level meter and the interim tail (dimmed) on the same line."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.text = ""
        self.interim = ""
        self.db = -100.0

    def level(self, db: float) -> None:
        self.db = db
        self._draw()

    def show_interim(self, text: str) -> None:
        self.interim = text
        self._draw()

    def delta(self, text: str) -> None:
        self.text += text
        if self.tty:
            self._draw()
        else:
            print(text, end="", flush=True)

    def _draw(self) -> None:
        if not self.tty:
            return
        bars = int(np.clip((self.db + 60) / 3, 0, 20))
        tail = f" {DIM}{self.interim}{PLAIN}" if self.interim else ""
        print(f"\r\x1b[K[{'#' * bars:<20}] {self.db:5.0f} dB | {self.text[-60:]}{tail}", end="", flush=True)


async def _file_source(samples: np.ndarray, queue: asyncio.Queue, stop: asyncio.Event) -> None:
    started = time.monotonic()
    for offset in range(0, len(samples), CHUNK):
        if stop.is_set():
            break
        await queue.put(samples[offset : offset + CHUNK])
        await asyncio.sleep(max(0.0, started + (offset + CHUNK) / SAMPLE_RATE - time.monotonic()))


async def _mic_source(sd, device: int | None, queue: asyncio.Queue, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def callback(indata, frames, at, status) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, indata[:, 0].copy())

    with sd.InputStream(
        samplerate=SAMPLE_RATE, channels=1, dtype="float32", blocksize=CHUNK, device=device, callback=callback
    ):
        await stop.wait()


async def _source(chunks: Awaitable[None], queue: asyncio.Queue, stop: asyncio.Event) -> None:
    """A source's chunks, then None: the file's end, Ctrl-C and a source that fails (a device
    that cannot open) end the session alike; the failure stays on the task, to be said."""
    try:
        await chunks
    finally:
        stop.set()
        queue.put_nowait(None)


@dataclass
class MicTranscript:
    """What a mic session said, across the utterances it took (a draining server ends one)."""

    texts: list[str] = field(default_factory=list)
    words: list[dict] = field(default_factory=list)  # on the session's clock
    sent_seconds: float = 0.0  # audio sent in the utterances before the running one

    def add(self, text: str, words: list[dict], seconds: float) -> None:
        self.texts.append(text)
        shift = self.sent_seconds
        self.words += [{**w, "start": w["start"] + shift, "end": w["end"] + shift} for w in words]
        self.sent_seconds += seconds


def save_format(path: str) -> str:
    return {".srt": "srt", ".vtt": "vtt", ".json": "json"}.get(Path(path).suffix.lower(), "text")


async def _utterance(
    connection,
    queue: asyncio.Queue,
    display: Display,
    language: str | None,
    transcript: MicTranscript,
    word_timestamps: bool,
    speakers: bool,
) -> tuple[int, str | None]:
    """Stream the source's chunks as one utterance until `transcription.done` (after Ctrl-C,
    or when a draining server ends it), kept in `transcript`: (exit status, final text)."""
    sent = 0

    async def send() -> None:
        nonlocal sent
        await update_session(connection, True, language, word_timestamps, speakers)
        await commit(connection)
        while (chunk := await queue.get()) is not None:
            display.level(_level_db(chunk))
            await send_audio(connection, chunk)
            sent += len(chunk)
        await commit(connection, final=True)

    sender = asyncio.create_task(send())
    try:
        async for message in connection:
            event = json.loads(message)
            if event["type"] == "transcription.delta":
                display.delta(event["delta"])
            elif event["type"] == "transcription.interim":
                display.show_interim(event["text"])
            elif event["type"] == "transcription.done":
                transcript.add(event["text"], event.get("words", []), sent / SAMPLE_RATE)
                return EXIT_OK, event["text"]
            elif event["type"] == "error":
                print(f"\nvoxrt mic: server error {event['code']}: {event['error']}", file=sys.stderr)
        return EXIT_SERVER_ERROR, None
    except WebSocketException as exc:
        print(f"\nvoxrt mic: connection lost: {exc}", file=sys.stderr)
        return EXIT_CONNECTION, None
    finally:
        sender.cancel()


async def _run(args: argparse.Namespace, sd, samples: np.ndarray | None) -> int:
    display = Display()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    queue: asyncio.Queue = asyncio.Queue()
    if samples is not None:
        chunks = _file_source(samples, queue, stop)
    else:
        chunks = _mic_source(sd, args.device, queue, stop)
    source = asyncio.create_task(_source(chunks, queue, stop))
    connection, status, transcript = None, EXIT_OK, MicTranscript()
    try:
        # One utterance until Ctrl-C; a server that drains ends it (1001), and the words
        # spoken meanwhile wait in the queue for the next server the balancer picks.
        while status == EXIT_OK and not (stop.is_set() and queue.empty()):
            try:
                connection = await reopened(
                    connection, args.url, args.api_key, args.retry_seconds, refusal_notice("mic")
                )
            except InvalidStatus as exc:
                print(
                    f"voxrt mic: server refused the connection: HTTP {exc.response.status_code}",
                    file=sys.stderr,
                )
                return EXIT_CONNECTION
            except (OSError, InvalidHandshake, TimeoutError, ServerError) as exc:
                print(f"voxrt mic: cannot connect to {args.url}: {exc}", file=sys.stderr)
                return EXIT_CONNECTION
            timed = args.save is not None and save_format(args.save) != "text"
            status, final_text = await _utterance(
                connection, queue, display, args.language, transcript, timed, args.speakers
            )
            if final_text is not None:
                print(("\r\x1b[K" if display.tty else "\n") + final_text, flush=True)
                display.text = ""
            if not stop.is_set():
                with contextlib.suppress(TimeoutError):  # the server closes once it has drained
                    await asyncio.wait_for(connection.wait_closed(), CLOSE_WAIT_SECONDS)
    finally:
        stop.set()
        source.cancel()
        if connection is not None:
            await connection.close()
    if source.done() and not source.cancelled() and (failure := source.exception()) is not None:
        hint = "--list-devices names the inputs; --input-file plays a file"
        print(f"\nvoxrt mic: the audio input failed: {failure} ({hint})", file=sys.stderr)
        status = EXIT_USAGE
    if args.save is not None:
        try:
            Path(args.save).write_text(
                render(save_format(args.save), " ".join(transcript.texts), transcript.words)
            )
        except OSError as exc:
            print(f"voxrt mic: cannot write {args.save}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    return status


def run(args: argparse.Namespace) -> int:
    sd = None
    if args.list_devices or not args.input_file:
        sd = _sounddevice()
        if sd is None:
            return EXIT_USAGE
    if args.list_devices:
        print(sd.query_devices())
        return EXIT_OK
    samples = None
    if args.input_file:
        try:
            samples = load_audio_file(args.input_file)
        except UnreadableAudio as exc:
            print(f"voxrt mic: {exc}", file=sys.stderr)
            return EXIT_USAGE
    return asyncio.run(_run(args, sd, samples))
