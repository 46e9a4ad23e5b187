"""Concurrent real-time Whisper sessions on this machine: voxrt's server vs the usual loop.

Prints one JSON line. For N sessions paced in real time (each with a different lead-in,
so no two stream identical chunks), reports whether every session keeps up (its final
text arrives within 3 s of its audio ending), the share of wall time the model was busy,
and p50/p95 latency from a word's end in the audio to the delta that commits it.

The baseline is how streaming Whisper is usually written: every session, once per
second of new audio, runs transformers `generate` on its window padded to 30 s, one
session after another, with the same LocalAgreement policy as voxrt.
"""

import asyncio
import json
import time

import numpy as np
import torch
from transformers import WhisperFeatureExtractor

from benchmarks.speech import match_commits, speech_with_word_ends
from clients.connection import open_connection, stream_utterance
from realtime.config import EngineConfig
from realtime.engine import Engine
from realtime.logs import configure_logging
from realtime.server import RealtimeServer, ServerConfig
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.policy import LocalAgreement
from voxtral.whisper.runner import WhisperPolicy, WhisperRunner
from voxtral.whisper.weights import default_whisper_dir

SESSIONS = (1, 2, 4, 6, 8)
KEEP_UP_SECONDS = 3.0
P95_LIMIT = 3.0


def session_audio(base: np.ndarray, ends: list[float], i: int) -> tuple[np.ndarray, list[float]]:
    lead = round((i * 0.37) % 1.0, 2)
    audio = np.concatenate([np.zeros(int(lead * SAMPLE_RATE), np.float32), base])
    return audio, [e + lead for e in ends]


def summarize(latencies: list[float], lags: list[float], busy: float, wall: float) -> dict:
    lat = np.array(latencies) if latencies else np.array([np.inf])
    return {
        "keeps_up": bool(max(lags) <= KEEP_UP_SECONDS),
        "max_finish_lag_s": round(max(lags), 2),
        "busy_fraction": round(busy / wall, 3),
        "p50_latency_s": round(float(np.percentile(lat, 50)), 2),
        "p95_latency_s": round(float(np.percentile(lat, 95)), 2),
        "words_committed": len(latencies),
    }


async def run_voxrt(model: WhisperModel, n: int, base, words, ends) -> dict:
    engine = Engine(WhisperRunner(model), EngineConfig(max_sessions=n))
    busy = [0.0]
    engine.on_step = lambda seconds, _: busy.__setitem__(0, busy[0] + seconds)
    server = RealtimeServer(engine, ServerConfig(port=0, max_sessions=n), {"whisper"}, "whisper-tiny.en")
    await server.start()
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"

    async def one(i: int):
        audio, word_ends = session_audio(base, ends, i)
        async with await open_connection(url) as connection:
            result = await stream_utterance(connection, audio, chunk_ms=100, speed=1.0)
        # Kept up: the final text arrived soon after the audio ended (the baseline's final decode).
        finish_lag = result.done_at - len(audio) / SAMPLE_RATE
        return match_commits(words, word_ends, result.deltas), finish_lag, result

    started = time.monotonic()
    outcomes = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.monotonic() - started
    await server.drain_and_stop()
    latencies = [x for lat, _, _ in outcomes for x in lat]
    return summarize(latencies, [lag for _, lag, _ in outcomes], busy[0], wall)


def run_baseline(model: WhisperModel, n: int, base, words, ends) -> dict:
    """One `generate` per session per second of new audio, sessions one after another."""
    extractor = WhisperFeatureExtractor(feature_size=model.n_mels)
    policy = WhisperPolicy()
    sessions = []
    for i in range(n):
        audio, word_ends = session_audio(base, ends, i)
        sessions.append(
            {
                "audio": audio,
                "ends": word_ends,
                "start": 0,
                "decoded": 0,
                "commits": [],
                "done_at": None,
                "agreement": LocalAgreement(holdback_seconds=policy.holdback_seconds),
            }
        )
    busy = 0.0
    t0 = time.monotonic()
    while any(s["done_at"] is None for s in sessions):
        progressed = False
        for s in sessions:
            if s["done_at"] is not None:
                continue
            now = time.monotonic() - t0
            available = min(len(s["audio"]), int(now * SAMPLE_RATE))
            final = available == len(s["audio"])
            if available - s["decoded"] < SAMPLE_RATE and not final:
                continue
            window = s["audio"][s["start"] : available]
            seconds = len(window) / SAMPLE_RATE
            features = extractor(window, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
            # Busy is model time on both sides: voxrt's step time excludes its (item-wise) features too.
            started = time.monotonic()
            with torch.inference_mode():
                tokens = model.model.generate(features, return_timestamps=True)[0].tolist()
            segments = model.segments([t for t in tokens if t >= model.timestamp_begin or t < model.eot])
            hyp = None
            if segments:
                from voxtral.whisper.model import Hypothesis

                hyp = Hypothesis(tokens, segments, 0.0, 0.0)
            force = seconds > policy.max_window_seconds
            commit = s["agreement"].update(hyp, final, force, seconds > policy.trim_after_seconds, seconds)
            if commit.clear:
                s["start"] = (
                    available if hyp is not None or final else max(s["start"], available - SAMPLE_RATE)
                )
            elif commit.trim_seconds > 0:
                s["start"] += int(commit.trim_seconds * SAMPLE_RATE)
            s["decoded"] = available
            busy += time.monotonic() - started
            at = time.monotonic() - t0
            if commit.text:
                s["commits"].append((at, commit.text))
            if final:
                s["done_at"] = at
            progressed = True
        if not progressed:
            time.sleep(0.01)
    wall = time.monotonic() - t0
    latencies = [x for s in sessions for x in match_commits(words, s["ends"], s["commits"])]
    lags = [s["done_at"] - len(s["audio"]) / SAMPLE_RATE for s in sessions]
    return summarize(latencies, lags, busy, wall)


def max_sessions(results: dict[int, dict]) -> int:
    ok = [n for n, r in results.items() if r["keeps_up"] and r["p95_latency_s"] <= P95_LIMIT]
    return max(ok, default=0)


def main() -> None:
    configure_logging("warning")  # stdout carries the one JSON line
    torch.set_num_threads(2)
    model = WhisperModel(default_whisper_dir(), torch.device("cpu"), torch.float32)
    base, words, ends = speech_with_word_ends()
    ours, baseline = {}, {}
    for n in SESSIONS:
        ours[n] = asyncio.run(run_voxrt(model, n, base, words, ends))
    for n in SESSIONS:
        baseline[n] = run_baseline(model, n, base, words, ends)
        if not baseline[n]["keeps_up"]:
            break  # more sessions only fall further behind
    ours_max, base_max = max_sessions(ours), max_sessions(baseline)
    print(
        json.dumps(
            {
                "audio_seconds": round(len(base) / SAMPLE_RATE, 1),
                "voxrt": {str(n): r for n, r in ours.items()},
                "baseline": {str(n): r for n, r in baseline.items()},
                "max_realtime_sessions": ours_max,
                "baseline_max_realtime_sessions": base_max,
                "ratio_over_baseline": round(ours_max / max(1, base_max), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
