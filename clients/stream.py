"""`voxrt stream FILE...`: stream audio files to a server, paced, and print the transcript."""

import argparse
import asyncio
import json
import sys
from collections.abc import Callable

from websockets.exceptions import InvalidHandshake, InvalidStatus, WebSocketException

from captions import FORMATS, render
from clients.audio import SAMPLE_RATE, UnreadableAudio, float32_to_pcm16, load_audio_file
from clients.connection import RETRY_SECONDS, ServerError, StreamedUtterance, reopened, stream_utterance
from clients.listen import listen

EXIT_OK, EXIT_SERVER_ERROR, EXIT_USAGE, EXIT_CONNECTION = 0, 1, 2, 3
DEFAULT_URL = "ws://127.0.0.1:8000/v1/realtime"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="audio files (any format soundfile reads)")
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument(
        "--wire",
        choices=("vllm", "deepgram"),
        default="vllm",
        help="vLLM's realtime protocol, or Deepgram's live one (/v1/listen on --url's server)",
    )
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--realtime", action="store_true", help="pace at real time (the default)")
    pace.add_argument("--speed", type=float, default=1.0, help="pace at X times real time; 0 = unpaced")
    parser.add_argument("--chunk-ms", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print the server's events as JSON lines")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="the transcript written at the end: text, json (text and timed words), srt or vtt captions",
    )
    parser.add_argument("-o", "--output", default=None, help="write the transcript here (one FILE only)")
    parser.add_argument(
        "--interim",
        action="store_true",
        help="ask for interim text; on a terminal it trails the line, dimmed",
    )
    parser.add_argument(
        "--language", default=None, help="e.g. fr, for a multilingual model (default: detected)"
    )
    parser.add_argument(
        "--speakers", action="store_true", help="label who said each word: on each cue, turn or json word"
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--retry-seconds",
        type=float,
        default=RETRY_SECONDS,
        help="keep retrying a busy server (503) this long, as its Retry-After asks",
    )


def _fail(code: int, message: str) -> int:
    print(f"voxrt stream: {message}", file=sys.stderr)
    return code


def refusal_notice(prog: str) -> Callable[[InvalidStatus], None]:
    """What a client prints when a busy server refuses it and it will retry."""

    def say(exc: InvalidStatus) -> None:
        print(f"voxrt {prog}: server refused (HTTP {exc.response.status_code}); retrying", file=sys.stderr)

    return say


def _shower(args: argparse.Namespace, quiet: bool) -> Callable[[dict], None]:
    """What prints the server's events as they come: as JSON lines, or the committed text with
    the interim tail trailing it on a terminal."""
    committed: list[str] = []

    def show(event: dict) -> None:
        if quiet:
            return
        if args.json:
            print(json.dumps(event), flush=True)
            return
        kind, delta, tail = event.get("type"), None, None
        if kind == "transcription.delta":
            delta = event["delta"]
        elif kind == "transcription.interim":
            tail = event["text"]
        elif kind == "Results":  # Deepgram's: final ones are committed text
            text = event["channel"]["alternatives"][0]["transcript"]
            if event["is_final"] and text:
                delta = f" {text}" if committed else text
            elif not event["is_final"]:
                tail = text
        if delta is not None:
            committed.append(delta)
            print(delta, end="", flush=True)
        elif tail is not None and sys.stdout.isatty():
            text = "".join(committed)[-80:]
            print(f"\r\x1b[K{text} \x1b[2m{tail}\x1b[0m", end="", flush=True)

    return show


async def _listened(args: argparse.Namespace, samples, speed: float, quiet: bool) -> StreamedUtterance | int:
    """One recording on Deepgram's wire (its own connection), or the exit status saying why not."""
    try:
        return await listen(
            args.url,
            float32_to_pcm16(samples),
            "linear16",
            SAMPLE_RATE,
            args.api_key,
            args.chunk_ms,
            speed,
            _shower(args, quiet),
            args.interim,
            args.language,
            args.speakers,
            args.retry_seconds,
            refusal_notice("stream"),
        )
    except InvalidStatus as exc:
        return _fail(EXIT_CONNECTION, f"server refused the connection: HTTP {exc.response.status_code}")
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        return _fail(EXIT_CONNECTION, f"cannot connect to {args.url}: {exc}")
    except WebSocketException as exc:
        return _fail(EXIT_CONNECTION, f"connection lost: {exc}")


async def _stream(args: argparse.Namespace, audios: list) -> int:
    status, connection = EXIT_OK, None
    speed = 1.0 if args.realtime else args.speed
    quiet = args.format != "text" and args.output is None  # a document on stdout is all it carries
    try:
        for path, samples in audios:
            if args.wire == "deepgram":
                result = await _listened(args, samples, speed, quiet)
                if isinstance(result, int):
                    return result
            else:
                try:
                    connection = await reopened(
                        connection, args.url, args.api_key, args.retry_seconds, refusal_notice("stream")
                    )
                except InvalidStatus as exc:
                    return _fail(
                        EXIT_CONNECTION, f"server refused the connection: HTTP {exc.response.status_code}"
                    )
                except (OSError, InvalidHandshake, TimeoutError, ServerError) as exc:
                    return _fail(EXIT_CONNECTION, f"cannot connect to {args.url}: {exc}")
                try:
                    result = await stream_utterance(
                        connection,
                        samples,
                        args.chunk_ms,
                        speed,
                        _shower(args, quiet),
                        args.interim,
                        args.language,
                        word_timestamps=args.format in ("json", "srt", "vtt"),
                        speakers=args.speakers,
                    )
                except WebSocketException as exc:
                    return _fail(EXIT_CONNECTION, f"connection lost while streaming {path}: {exc}")
            finished = _finish(args, quiet, result, render(args.format, result.text, result.words))
            if finished == EXIT_USAGE:
                return finished
            status = finished or status
            if result.done is None:
                return EXIT_SERVER_ERROR
    finally:
        if connection is not None:
            await connection.close()
    return status


def _finish(args: argparse.Namespace, quiet: bool, result: StreamedUtterance, document: str) -> int:
    """The transcript written where asked and the server's errors told: the exit status."""
    if args.output is not None:
        try:
            with open(args.output, "w", encoding="utf-8") as out:
                out.write(document)
        except OSError as exc:
            return _fail(EXIT_USAGE, f"cannot write {args.output}: {exc}")
    if quiet:
        print(document, end="", flush=True)
    elif not args.json:
        print(f"\r\x1b[K{result.text}" if sys.stdout.isatty() else f"\n{result.text}", flush=True)
    for error in result.errors:
        print(f"voxrt stream: server error {error.get('code')}: {error.get('error')}", file=sys.stderr)
    return EXIT_SERVER_ERROR if result.errors else EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.chunk_ms <= 0 or args.speed < 0:
        return _fail(EXIT_USAGE, "--chunk-ms must be positive and --speed not negative")
    if args.output is not None and len(args.files) > 1:
        return _fail(EXIT_USAGE, "--output takes the transcript of one FILE")
    audios = []
    for path in args.files:
        try:
            audios.append((path, load_audio_file(path)))
        except UnreadableAudio as exc:
            return _fail(EXIT_USAGE, str(exc))
    return asyncio.run(_stream(args, audios))
