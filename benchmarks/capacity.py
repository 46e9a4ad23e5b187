"""Admission by measured capacity, as a user meets it: 12 sessions of realistic speech
connect at once to one server with the default model and settings.

Prints one JSON line: how many were admitted; per admitted session, committed-word
latency (as `benchmarks/whisper_streaming.py` measures it) and when its final text came
after its audio ended; how refused ones were answered (status, code, Retry-After); and
the furthest any session fell behind real time, sampled every 0.5 s. Each session reads
its own ~50 s passage (`benchmarks/speech.py`: long sentences, six voices of two
engines, pauses, noise on every other one).

    .venv/bin/python -m benchmarks.capacity [--sessions 12]
"""

import argparse
import asyncio
import json

import numpy as np
import torch

from benchmarks.client_process import ClientProcess, Refused
from benchmarks.speech import Passage, passage
from benchmarks.whisper_streaming import percentile, snapshots, word_latencies
from clients.connection import Utterance
from realtime.config import EngineConfig, ServedModel, ServerConfig
from realtime.engine import Engine
from realtime.logs import configure_logging
from realtime.server import RealtimeServer
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.runner import WhisperRunner
from voxtral.whisper.weights import default_whisper_dir


async def run(model: WhisperModel, passages: list[Passage], clients: ClientProcess) -> dict:
    engine = Engine(WhisperRunner(model), EngineConfig())
    server = RealtimeServer(engine, ServerConfig(port=0), ServedModel(name="whisper-tiny.en"))
    await server.start()
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"

    lags: list[float] = []

    async def sample_lag() -> None:
        while True:
            await asyncio.sleep(0.5)
            lags.append(server.admission.lag_seconds)

    sampler = asyncio.create_task(sample_lag())
    results = await asyncio.to_thread(clients.stream_sessions, url, [p.audio for p in passages])
    sampler.cancel()
    await server.drain_and_stop()
    admitted = [(p, r) for p, r in zip(passages, results, strict=True) if isinstance(r, Utterance)]
    committed = [x for p, r in admitted for x in word_latencies(p, snapshots(r.deltas, [])[0])]
    refused = {(r.status, r.code, r.retry_after) for r in results if isinstance(r, Refused)}
    return {
        "sessions": len(passages),
        "admitted": len(admitted),
        "refused": sorted(refused),
        "committed_p50_s": percentile(committed, 50),
        "committed_p95_s": percentile(committed, 95),
        "final_after_audio_s": sorted(round(r.done_at - len(p.audio) / SAMPLE_RATE, 2) for p, r in admitted),
        "max_lag_s": round(max(lags, default=0.0), 2),
        "lag_last_half_max_s": round(max(lags[len(lags) // 2 :], default=0.0), 2),
        "passage_seconds": round(float(np.mean([len(p.audio) / SAMPLE_RATE for p in passages])), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=12)
    args = parser.parse_args()
    configure_logging("warning")  # stdout carries the one JSON line
    torch.set_num_threads(2)
    float32 = WhisperModel(default_whisper_dir(), torch.device("cpu"), torch.float32)
    passages = [passage(float32, i) for i in range(args.sessions)]  # word ends from the float32 model
    model = WhisperModel(default_whisper_dir(), torch.device("cpu"), torch.float32, int8=True)
    with ClientProcess() as clients:
        print(json.dumps(asyncio.run(run(model, passages, clients))))


if __name__ == "__main__":
    main()
