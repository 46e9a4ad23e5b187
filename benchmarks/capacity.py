"""Admission as users meet it: N sessions of real speech, each its own, arriving 0.5 s apart
at a fresh default `voxrt serve` (built here from its flags, clients in a process of
their own); one refused retries after its `Retry-After` until admitted or
`--retry-seconds` pass.

Each session streams `--seconds` of the three real recordings (`benchmarks/real_speech.py`,
with pauses between them) from its own offset, with a faint noise of its own: identical
audio would share caches and flatter.

Prints one JSON line: per model and number of arrivals, how many were admitted at the
first try and in all, kept up (final text within 1 s of the audio's end), shed, never
admitted; the latest final after its audio, the furthest any session fell behind real
time (sampled every 0.5 s), and the capacity and projected session cost at the end.

    .venv/bin/python -m benchmarks.capacity [--arrivals 1,4,8,12,16] [--models whisper-tiny.en,whisper-base]
"""

import argparse
import asyncio
import json

import numpy as np

from benchmarks.client_process import ClientProcess, Refused
from benchmarks.real_speech import REFERENCES, recording
from clients.audio import distinct_audio
from clients.connection import StreamedUtterance
from realtime.cli import build_server, serve_parser
from realtime.logs import configure_logging
from voxtral.audio import SAMPLE_RATE

ARRIVAL_SECONDS = 0.5
KEPT_UP_SECONDS = 1.0  # a final text this soon after the audio's end kept up
OFFSET_SECONDS = 6.8  # between sessions' starting points on the recordings


def sessions_audio(count: int, seconds: float) -> list[np.ndarray]:
    """`count` streams of `seconds`, each from its own offset on the recordings (looped,
    with a 1 s pause after each) and with its own faint noise."""
    pause = np.zeros(SAMPLE_RATE, np.float32)
    loop = np.concatenate([part for name in REFERENCES for part in (recording(name).audio, pause)])
    length = round(seconds * SAMPLE_RATE)
    audios = []
    for index in range(count):
        start = round(index * OFFSET_SECONDS * SAMPLE_RATE) % len(loop)
        audios.append(distinct_audio(np.roll(loop, -start)[:length], index))
    return audios


async def arrivals(
    model: str, audios: list[np.ndarray], retry_seconds: float, clients: ClientProcess
) -> dict:
    server = build_server(serve_parser().parse_args(["--host=127.0.0.1", "--port=0", f"--model={model}"]))
    await server.start()
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    lags: list[float] = []

    async def sample_lag() -> None:
        while True:
            await asyncio.sleep(0.5)
            lags.append(server.admission.lag_seconds)

    sampler = asyncio.create_task(sample_lag())
    results = await asyncio.to_thread(
        clients.stream_sessions, url, audios, arrival_seconds=ARRIVAL_SECONDS, retry_seconds=retry_seconds
    )
    sampler.cancel()
    stats = server.engine.stats()
    await server.drain_and_stop()
    paired = zip(results, audios, strict=True)
    admitted = [(a, audio) for a, audio in paired if isinstance(a.result, StreamedUtterance)]
    finals = [a.result.done_at - len(audio) / SAMPLE_RATE for a, audio in admitted if a.result.done]
    shed = [a for a, _ in admitted if any(e.get("code") == "server_overloaded" for e in a.result.errors)]
    refusals = {(r.status, r.code, r.retry_after) for a in results for r in a.refusals}
    return {
        "arrivals": len(audios),
        "admitted_first_try": sum(1 for a, _ in admitted if not a.refusals),
        "admitted": len(admitted),
        "kept_up": sum(1 for f in finals if f <= KEPT_UP_SECONDS),
        "shed": len(shed),
        "never_admitted": sum(1 for a in results if isinstance(a.result, Refused)),
        "refused_with": sorted(refusals),
        "final_after_audio_max_s": round(max(finals), 2) if finals else None,
        "max_lag_s": round(max(lags, default=0.0), 2),
        "capacity_at_end": stats.capacity_sessions,
        "session_step_s": round(stats.session_step_seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arrivals", default="1,4,8,12,16")
    parser.add_argument("--models", default="whisper-tiny.en,whisper-base")
    parser.add_argument("--seconds", type=float, default=20.0, help="of speech per session")
    parser.add_argument("--retry-seconds", type=float, default=300.0)
    args = parser.parse_args()
    configure_logging("warning")  # stdout carries the one JSON line
    counts = [int(n) for n in args.arrivals.split(",")]
    audios = sessions_audio(max(counts), args.seconds)
    out: dict = {"seconds_per_session": args.seconds, "arrival_seconds": ARRIVAL_SECONDS}
    with ClientProcess() as clients:
        for model in args.models.split(","):
            out[model] = [
                asyncio.run(arrivals(model, audios[:n], args.retry_seconds, clients)) for n in counts
            ]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
