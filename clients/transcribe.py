"""`voxrt transcribe FILE...`: recordings to text or captions through OpenAI's file API
(`POST /v1/audio/transcriptions`), from a server at `--url`, or one this command starts
(`voxrt serve`'s flags choose its model; `--api-key` is the key sent, and the started one's).

Text streams as the server commits it (`stream=true`); json, srt and vtt come whole. On a
terminal a bar counts the files done and the seconds of audio sent."""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import soundfile
from tqdm import tqdm

from captions import FORMATS
from clients.stream import EXIT_CONNECTION, EXIT_OK, EXIT_SERVER_ERROR, EXIT_USAGE

RETRIES = 5  # a busy server (429, 503) is asked again after its Retry-After, this many times


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="recordings: WAV, FLAC, Ogg, MP3")
    parser.add_argument(
        "--url", default=None, help="a server, e.g. http://127.0.0.1:8000 (default: start one here)"
    )
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.add_argument(
        "--output-dir", default=None, help="write FILE's transcript to DIR/<name>.<format> (default: stdout)"
    )
    parser.add_argument("--language", default=None, help="e.g. fr, for a multilingual model")
    parser.add_argument("--prompt", default=None, help="names and terms said in it, for spelling")
    parser.add_argument(
        "--speakers", action="store_true", help="name each turn's speaker (S1, S2...): a text line per turn"
    )


class UploadRefused(Exception):
    """The server refused the file: its status and OpenAI error."""


def _form(path: Path, fields: dict[str, str]) -> tuple[bytes, str]:
    """A multipart body with the file and `fields`, and its content type."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    name = path.name.replace('"', "%22")
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
    head += "Content-Type: application/octet-stream\r\n\r\n"
    parts.append(head.encode() + path.read_bytes() + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _post(url: str, path: Path, fields: dict[str, str], api_key: str | None):
    body, content_type = _form(path, fields)
    headers = {"Content-Type": content_type}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    for attempt in range(RETRIES + 1):
        request = urllib.request.Request(f"{url}/v1/audio/transcriptions", body, headers, method="POST")
        try:
            return urllib.request.urlopen(request, timeout=3600)
        except urllib.error.HTTPError as exc:
            retry = exc.headers.get("Retry-After")
            if exc.code in (429, 503) and retry and attempt < RETRIES:
                time.sleep(float(retry))
                continue
            try:
                message = f"{exc.code} {_described(json.loads(exc.read())['error'])}"
            except (ValueError, KeyError, TypeError):
                message = f"{exc.code} {exc.reason}"
            raise UploadRefused(message) from None
    raise AssertionError("unreachable")


def _described(error: dict) -> str:
    return f"{error['code']}: {error['message']}"


def _streamed_text(response) -> Iterator[str]:
    """The deltas of a `stream=true` response, as its server-sent events carry them; an error
    event (the status was sent before the file failed, one that stops decoding midway) raises."""
    for line in response:
        if line.startswith(b"data: "):
            event = json.loads(line[6:])
            if "error" in event:
                raise UploadRefused(_described(event["error"]))
            if event.get("type") == "transcript.text.delta":
                yield event["delta"]


def transcribe(url: str, path: Path, args: argparse.Namespace, out) -> None:
    """One file's transcript, written to `out` (text as it comes)."""
    # Text streams as it is committed; a turn's speaker is named once the file is done.
    streamed = args.format == "text" and not args.speakers
    formats = {"text": "json" if streamed else "text", "json": "verbose_json"}
    fields = {"model": "whisper-1", "response_format": formats.get(args.format, args.format)}
    if args.format == "json":
        fields["timestamp_granularities[]"] = "word"
    fields.update({k: v for k, v in (("language", args.language), ("prompt", args.prompt)) if v})
    if args.speakers:
        fields["diarize"] = "true"
    if streamed:
        fields["stream"] = "true"
    with _post(url, path, fields, args.api_key) as response:
        if not streamed:
            out.write(response.read().decode())
            return
        first = True
        try:
            for delta in _streamed_text(response):
                out.write(delta if first else " " + delta)
                out.flush()
                first = False
        finally:
            out.write("\n")


def _transcribe_to(target: Path, url: str, path: Path, args: argparse.Namespace) -> None:
    """`path`'s transcript in `target`, whole or not at all: a file the server fails partway
    leaves no transcript that reads as done."""
    partial = target.with_name(target.name + ".part")
    try:
        with open(partial, "w") as out:
            transcribe(url, path, args, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)


def run_files(url: str, args: argparse.Namespace) -> int:
    paths = [Path(f) for f in args.files]
    for path in paths:
        try:
            soundfile.info(str(path))
        except (RuntimeError, soundfile.LibsndfileError) as exc:
            print(f"voxrt transcribe: {path}: not a recording this reads: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.output_dir:
        try:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"voxrt transcribe: cannot write to {args.output_dir}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    seconds = sum(soundfile.info(str(p)).duration for p in paths)
    bar = tqdm(total=round(seconds), unit="s", desc="audio", disable=not sys.stderr.isatty(), file=sys.stderr)
    status = EXIT_OK
    try:
        for path in paths:
            ext = "txt" if args.format == "text" else args.format
            # A file the server refuses is named and the rest go on; the exit says one failed.
            try:
                if args.output_dir:
                    _transcribe_to(Path(args.output_dir) / f"{path.stem}.{ext}", url, path, args)
                else:
                    transcribe(url, path, args, sys.stdout)
            except UploadRefused as exc:
                print(f"voxrt transcribe: {path}: {exc}", file=sys.stderr)
                status = EXIT_SERVER_ERROR
            bar.update(round(soundfile.info(str(path)).duration))
    except OSError as exc:
        print(f"voxrt transcribe: cannot reach {url}: {exc}", file=sys.stderr)
        return EXIT_CONNECTION
    finally:
        bar.close()
    return status


def run(args: argparse.Namespace) -> int:
    return run_files(args.url.rstrip("/"), args)
