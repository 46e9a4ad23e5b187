"""Voxtral Realtime at its published size, random weights, through the engine on this machine.

Prints one JSON line. A bfloat16 checkpoint with Voxtral-Mini-4B-Realtime-2602's
configuration (`REAL_SIZE` in tests/fixtures/tiny_voxtral.py, which cites its sources) is
built once into `--checkpoint` and loaded as `voxrt serve --model DIR` loads it. Two
sessions of a few seconds of speech stream through the engine, alone and then together;
transformers' `generate` transcribes the same audio in a separate process. Reported: the
engine's tokens equal `generate`'s at every position (and are varied), peak RSS of each
process, KV-ring memory per session at the real windows, ms per step at 1 and 2 sessions,
and the weight bytes a step reads against this machine's measured memory bandwidth: the
least time a step can take when reading weights is the bottleneck.

    .venv/bin/python -m benchmarks.voxtral_real_size [--checkpoint /tmp/voxtral-4b] [--seconds 3]
"""

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.engine_throughput import isolated, speech
from realtime.config import EngineConfig
from realtime.engine import Engine
from realtime.logs import configure_logging
from tests.fixtures.tiny_voxtral import REAL_SIZE, build_tiny_voxtral
from tests.voxtral_harness import Feed, drive, pieces, reference_tokens
from voxtral.loading import load_model


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(path: Path) -> None:
    configure_logging("warning")
    build_tiny_voxtral(path, REAL_SIZE)


def run_engine(path: Path, audios: list[np.ndarray], threads: int) -> dict:
    configure_logging("warning")
    torch.set_num_threads(threads)
    loaded = load_model(str(path), "cpu", "bfloat16", max_sessions=len(audios))
    model = loaded.runner.model
    engine = Engine(loaded.runner, EngineConfig(max_sessions=len(audios)))
    steps: list[tuple[float, int]] = []
    engine.on_step = lambda seconds, sessions: steps.append((seconds, sessions))
    out: dict = {"slot_mb": round(model.slot_bytes / 2**20, 1)}
    # Every parameter once: the tied embedding is read whole as the output projection.
    out["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.model.parameters())
    tokens = {}
    for label, batch in (("1", audios[:1]), ("2", audios)):
        steps.clear()
        feeds = {f"{label}-{i}": Feed(pieces(audio, "80ms")) for i, audio in enumerate(batch)}
        drive(engine, feeds)
        tokens[label] = [feed.request.output_token_ids for feed in feeds.values()]
        full = [seconds for seconds, sessions in steps if sessions == len(batch)]
        out[f"ms_per_step_{label}"] = round(1000 * float(np.median(full)), 1)
        out[f"steps_{label}"] = len(full)
    out["tokens"] = tokens
    out["peak_rss_mb"] = round(peak_rss_mb())
    return out


def run_reference(path: Path, audios: list[np.ndarray], threads: int) -> dict:
    configure_logging("warning")
    torch.set_num_threads(threads)
    return {
        "tokens": [reference_tokens(path, audio) for audio in audios],
        "peak_rss_mb": round(peak_rss_mb()),
    }


def memory_bandwidth_gb_s(threads: int) -> float:
    """Best of 5 reads of a 1 GiB tensor (a sum: one pass, nothing written)."""
    torch.set_num_threads(threads)
    data = torch.ones(2**28, dtype=torch.float32)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - started)
    return data.nbytes / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/voxtral-4b-random"))
    parser.add_argument("--seconds", type=float, default=3.0, help="speech per session")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    audio = speech(2 * args.seconds)
    half = int(args.seconds * 16_000)
    audios = [audio[:half], audio[half:]]
    if not (args.checkpoint / "config.json").is_file():
        started = time.perf_counter()
        isolated(build, args.checkpoint)
        print(f"built {args.checkpoint} in {time.perf_counter() - started:.0f} s", flush=True)
    engine = isolated(run_engine, args.checkpoint, audios, args.threads)
    reference = isolated(run_reference, args.checkpoint, audios, args.threads)
    bandwidth = isolated(memory_bandwidth_gb_s, args.threads)
    ours = engine.pop("tokens")
    expected = reference["tokens"]
    weight_bytes = engine.pop("weight_bytes")
    result = {
        "device": "cpu",
        "dtype": "bfloat16",
        "threads": args.threads,
        "seconds_per_session": args.seconds,
        "weights_gb": round(weight_bytes / 1e9, 2),
        "tokens_equal_generate": ours["1"] == expected[:1] and ours["2"] == expected,
        "tokens_varied": all(len(set(t)) >= 8 for t in expected),
        "positions_compared": sum(len(t) for t in expected),
        **engine,
        "reference_peak_rss_mb": reference["peak_rss_mb"],
        "memory_bandwidth_gb_s": round(bandwidth, 1),
        "weight_read_floor_ms_per_step": round(weight_bytes / (bandwidth * 1e9) * 1000, 1),
    }
    if not result["tokens_equal_generate"]:
        result["first_tokens"] = {"engine": ours["2"][0][:20], "generate": expected[0][:20]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
