"""One session for hours, measured per hour of audio: does a step cost more, or memory
grow, the longer a session runs?

A `voxrt serve` (built from the same flags, in this process) takes one client, in a
process of its own, that streams speech with pauses as fast as backpressure lets it: the
three real recordings (`benchmarks/real_speech.py`) looped, each loop in its own order,
gain and faint noise (identical audio would share caches and flatter), with silence
between them for `1 - --speech-share` of the time. On vLLM's wire the hours are one
utterance; on OpenAI's, the server VAD's sequence of items on one connection.

Prints one JSON line: per hour of audio the server read, step time (p50, p95, mean: the
steps that ran the model for the session), resident memory (of a sample every 0.5 s: the
hour's median, most, and its last tenth's median, where the hour left it), encoder-cache
rows, feature-cache entries and tokens emitted, and whether it stayed flat (the last hour's
mean step time within 10 % of the first's, RSS grown under 20 MB from the first hour's end
to the last's).

    .venv/bin/python -m benchmarks.long_session --wire vllm --hours 8       # tiny.en, int8 as served
    .venv/bin/python -m benchmarks.long_session --wire openai --hours 8
    .venv/bin/python -m benchmarks.long_session --model voxtral-tiny --minutes 10
"""

import argparse
import asyncio
import base64
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect

from benchmarks.real_speech import REFERENCES, recording
from benchmarks.voxtral_long import LONG_SPEC, rss_mb
from benchmarks.whisper_streaming import percentile
from clients.audio import distinct_audio, float32_to_pcm16
from clients.connection import commit, open_connection, send_audio
from realtime.cli import build_server, serve_parser
from realtime.logs import configure_logging
from voxtral.audio import SAMPLE_RATE

HOUR = 3600 * SAMPLE_RATE
CHUNK = SAMPLE_RATE // 10  # 100 ms, as a microphone client sends


def speech_with_pauses(seconds: float, speech_share: float) -> Iterator[np.ndarray]:
    """`seconds` of audio in 100 ms chunks: the recordings looped, each loop distinct."""
    recordings = [recording(name).audio for name in REFERENCES]
    left, loop = round(seconds * SAMPLE_RATE), 0
    while left > 0:
        rng = np.random.default_rng(loop)
        for index in np.roll(np.arange(len(recordings)), -loop):
            speech = recordings[index] * rng.uniform(0.6, 1.0)
            pause_mean = len(speech) * (1 / speech_share - 1)
            pause = np.zeros(round(rng.uniform(0.5, 1.5) * pause_mean), np.float32)
            audio = distinct_audio(np.concatenate([speech, pause]).astype(np.float32), (loop, int(index)))
            for offset in range(0, min(len(audio), left), CHUNK):
                yield audio[offset : min(offset + CHUNK, left)]
            left -= min(len(audio), left)
            if left <= 0:
                return
        loop += 1


@dataclass
class ClientReport:
    sent_seconds: float = 0.0
    text_chars: int = 0
    items: int = 0  # OpenAI: transcripts completed
    errors: list[dict] = field(default_factory=list)


async def stream_vllm(url: str, chunks: Iterator[np.ndarray], report: ClientReport) -> None:
    async with await open_connection(url) as connection:
        await commit(connection)

        async def send() -> None:
            for chunk in chunks:
                await send_audio(connection, chunk)
                report.sent_seconds += len(chunk) / SAMPLE_RATE
            await commit(connection, final=True)

        sender = asyncio.create_task(send())
        async for message in connection:
            event = json.loads(message)
            if event["type"] == "transcription.done":
                report.text_chars = len(event["text"])
                break
            if event["type"] == "error":
                report.errors.append(event)
        await sender


async def stream_openai(url: str, chunks: Iterator[np.ndarray], report: ClientReport) -> None:
    session = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": SAMPLE_RATE},
                "turn_detection": {"type": "server_vad"},
            }
        },
    }
    async with connect(url + "?intent=transcription", max_size=None) as connection:
        await connection.send(json.dumps({"type": "session.update", "session": session}))
        committed, updates, answered = 0, 0, False

        async def send() -> None:
            for chunk in chunks:
                audio = base64.b64encode(float32_to_pcm16(chunk)).decode()
                await connection.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                report.sent_seconds += len(chunk) / SAMPLE_RATE
            # The server reads in order: the update's answer comes after this commit's, after
            # all the audio, and every item is committed by then.
            await connection.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await connection.send(json.dumps({"type": "session.update", "session": session}))

        sender = asyncio.create_task(send())
        async for message in connection:
            event = json.loads(message)
            kind = event["type"]
            committed += kind == "input_audio_buffer.committed"
            if kind == "session.updated":
                updates += 1
                answered = updates == 2
            elif kind == "conversation.item.input_audio_transcription.completed":
                report.items += 1
                report.text_chars += len(event["transcript"])
            elif kind == "error" and event["error"]["code"] != "input_audio_buffer_commit_empty":
                report.errors.append(event["error"])
            if answered and report.items == committed:
                break
        await sender


def client(url: str, wire: str, hours: float, speech_share: float, minutes: float | None) -> None:
    """The client process: streams until `hours` of audio or `minutes` of wall time, then
    prints its `ClientReport` as JSON."""
    deadline = time.monotonic() + 60 * minutes if minutes else None

    def chunks() -> Iterator[np.ndarray]:
        for chunk in speech_with_pauses(hours * 3600, speech_share):
            if deadline is not None and time.monotonic() > deadline:
                break
            yield chunk
        yield np.zeros(3 * SAMPLE_RATE, np.float32)  # the last turn ends in a pause

    report = ClientReport()
    asyncio.run((stream_vllm if wire == "vllm" else stream_openai)(url, chunks(), report))
    print(json.dumps(report.__dict__))


@dataclass
class Hour:
    """What the server held when it had read one more hour of the session's audio."""

    ended_at: float
    encoder_rows_referenced: int  # by the session's live utterances
    encoder_rows_resident: int  # referenced, or kept for reuse up to the cache's capacity
    feature_cache_entries: int
    tokens: int


async def measure(serve_flags: list[str], args: argparse.Namespace) -> dict:
    server = build_server(serve_parser().parse_args(serve_flags))
    await server.start()
    engine = server.engine
    steps: list[tuple[float, float]] = []  # (ended at, model seconds) of steps that decoded
    metered = engine.on_step

    def on_step(seconds: float, decoded: int) -> None:
        metered(seconds, decoded)
        if decoded:
            steps.append((time.monotonic(), seconds))

    engine.on_step = on_step
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    command = ["-m", "benchmarks.long_session", "--client", url, "--wire", args.wire]
    command += ["--hours", str(args.hours), "--speech-share", str(args.speech_share)]
    if args.minutes:
        command += ["--minutes", str(args.minutes)]
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(sys.executable, *command, stdout=asyncio.subprocess.PIPE)
    reading = asyncio.create_task(process.stdout.read())
    received = 0.0  # seconds of the session's audio the server has read: within
    # `--max-buffered-seconds` of what the engine consumed
    hours = [Hour(started, 0, 0, 0, 0)]
    # Resident memory every poll: one sample may fall inside a step holding a long window's
    # activations (tens of MB); the hour's median does not.
    rss: list[tuple[float, float]] = []

    def sample() -> None:
        nonlocal received
        stats = engine.snapshot
        rss.append((time.monotonic(), rss_mb()))
        received = max(received, sum(c.audio_seconds for c in server.connections))
        while received * SAMPLE_RATE >= len(hours) * HOUR:
            rows = stats.encoder_cache_rows, stats.encoder_cache_resident_rows
            hours.append(Hour(time.monotonic(), *rows, len(engine.feature_cache), stats.tokens))

    while not reading.done():
        sample()
        await asyncio.sleep(0.5)
    report = json.loads(await reading)
    received = max(received, report["sent_seconds"])  # the last poll may come after the close
    sample()
    await server.drain_and_stop()

    def tenth(last: Hour, first: Hour) -> float:
        return last.ended_at - (last.ended_at - first.ended_at) / 10

    per_hour = []
    for index, (first, last) in enumerate(itertools.pairwise(hours)):
        ms = [1000 * s for at, s in steps if first.ended_at < at <= last.ended_at]
        per_hour.append(
            {
                "hour": index + 1,
                "step_ms_p50": percentile(ms, 50),
                "step_ms_p95": percentile(ms, 95),
                "step_ms_mean": round(sum(ms) / len(ms), 1),
                "steps": len(ms),
                "rss_mb": round(
                    float(np.median([m for at, m in rss if first.ended_at < at <= last.ended_at]))
                ),
                "rss_mb_max": round(max(m for at, m in rss if first.ended_at < at <= last.ended_at)),
                # Where the hour left memory: the median of its last tenth.
                "rss_mb_end": round(
                    float(np.median([m for at, m in rss if tenth(last, first) <= at <= last.ended_at]))
                ),
                "encoder_rows_referenced": last.encoder_rows_referenced,
                "encoder_rows_resident": last.encoder_rows_resident,
                "feature_cache_entries": last.feature_cache_entries,
                "tokens": last.tokens - first.tokens,
                "wall_minutes": round((last.ended_at - first.ended_at) / 60, 1),
            }
        )
    flat = None
    if len(per_hour) >= 2:
        first, last = per_hour[0], per_hour[-1]
        flat = {
            "last_vs_first_step_p50": round(last["step_ms_p50"] / first["step_ms_p50"], 3),
            "last_vs_first_step_mean": round(last["step_ms_mean"] / first["step_ms_mean"], 3),
            "rss_growth_after_first_hour_mb": last["rss_mb_end"] - first["rss_mb_end"],
        }
        # The mean: a step of a fast upload decodes one window or many (turns that ended), and
        # which hour's median falls on which kind moves it by a fifth.
        steady = flat["last_vs_first_step_mean"] <= 1.1
        flat["flat"] = steady and flat["rss_growth_after_first_hour_mb"] < 20
    return {
        "model": args.model,
        "wire": args.wire,
        "speech_share": args.speech_share,
        "audio_hours": round(report["sent_seconds"] / 3600, 2),
        "wall_minutes": round((time.monotonic() - started) / 60, 1),
        "text_chars": report["text_chars"],
        "items": report["items"],
        "errors": [e.get("code") for e in report["errors"]],
        "per_hour": per_hour,
        "flat": flat,
        "encoder_cache_capacity_rows": engine.snapshot.encoder_cache_capacity,
        "feature_cache_bytes": engine.snapshot.feature_cache_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", default="whisper-tiny.en", help="what voxrt serve --model takes, or voxtral-tiny"
    )
    parser.add_argument("--wire", choices=["vllm", "openai"], default="vllm")
    parser.add_argument("--hours", type=float, default=8.0)
    parser.add_argument("--speech-share", type=float, default=0.4)
    parser.add_argument(
        "--minutes", type=float, default=None, help="stop streaming after this much wall time"
    )
    parser.add_argument("--client", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args.client, args.wire, args.hours, args.speech_share, args.minutes)
        return
    configure_logging("warning")  # stdout carries the one JSON line
    # One utterance for the whole session on vLLM's wire: past the default 4-hour cap.
    flags = ["--host=127.0.0.1", "--port=0", f"--max-session-seconds={args.hours * 3600 + 600:.0f}"]
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model == "voxtral-tiny":
            from tests.fixtures.tiny_voxtral import build_tiny_voxtral

            model = str(build_tiny_voxtral(Path(scratch) / "voxtral", LONG_SPEC))
        print(json.dumps(asyncio.run(measure([*flags, f"--model={model}"], args))))


if __name__ == "__main__":
    main()
