"""Voxtral Realtime at its published size, random weights, through the engine on this machine.

Prints one JSON line. A bfloat16 checkpoint with Voxtral-Mini-4B-Realtime-2602's
configuration (`REAL_SIZE` in tests/fixtures/tiny_voxtral.py, which cites its sources) is
built once into `--checkpoint` and loaded as `voxrt serve --model DIR` loads it, in
`--dtype`. Sessions of a few seconds of speech stream through the engine, alone and then
`--sessions` together; transformers' `generate` transcribes the same audio in a separate
process, from the features the engine computes (see `reference_tokens`). Reported: whether
the engine's tokens equal `generate`'s (and are varied), where they first differ, and, with
the engine's own tokens fed back, the share of positions where transformers' forward pass
picks the engine's token and the largest logit gap where it does not (in units of the
logits' standard deviation: a near-tie is a rounding difference, a large gap a bug), and the
same share for `generate`'s own tokens (transformers against itself); peak RSS
of each process, KV-ring memory per session at the real windows, ms per step, and the weight
bytes a step reads against this machine's measured memory bandwidth: the least time a step
can take when reading weights is the bottleneck.

    .venv/bin/python -m benchmarks.voxtral_real_size [--dtype bfloat16] [--sessions 2] [--seconds 2]
        [--device cuda]

float32 needs 17.7 GB for the weights per process: on a 24 GB machine, `--sessions 1`.
"""

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.engine_throughput import isolated, speech
from realtime.engine.config import EngineConfig
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from tests.fixtures.tiny_voxtral import REAL_SIZE, build_tiny_voxtral
from tests.voxtral_harness import Feed, choice_gaps, drive, pieces, reference_tokens, teacher_forced_logits
from voxtral.loading import load_model


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(path: Path) -> None:
    configure_logging("warning")
    build_tiny_voxtral(path, REAL_SIZE)


def run_engine(path: Path, audios: list[np.ndarray], threads: int, dtype: str, device: str) -> dict:
    configure_logging("warning")
    torch.set_num_threads(threads)
    loaded = load_model(str(path), device, dtype, max_sessions=len(audios))
    model = loaded.runner.model
    engine = Engine(loaded.runner, EngineConfig(max_sessions=len(audios)))
    steps: list[tuple[float, int]] = []
    engine.on_step = lambda seconds, sessions: steps.append((seconds, sessions))
    out: dict = {"slot_mb": round(model.slot_bytes / 2**20, 1)}
    # Every parameter once: the tied embedding is read whole as the output projection.
    out["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.model.parameters())
    # Warm first (allocator, first kernels, pages of the weights): then neither batch pays it.
    drive(engine, {"warm-up": Feed(pieces(audios[0][:8_000], "80ms"))})
    tokens = {}
    batches = {"1": audios[:1]} | ({str(len(audios)): audios} if len(audios) > 1 else {})
    for label, batch in batches.items():
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


def run_reference(
    path: Path,
    audios: list[np.ndarray],
    engine_tokens: list[list[int]],
    threads: int,
    dtype: str,
    device: str,
) -> dict:
    configure_logging("warning")
    torch.set_num_threads(threads)
    tokens = [
        reference_tokens(path, audio, engine_features=True, dtype=dtype, device=device) for audio in audios
    ]
    agree, gaps, disagreements = 0, [0.0], []
    for session, (audio, ours) in enumerate(zip(audios, engine_tokens, strict=True)):
        logits = teacher_forced_logits(path, audio, ours, dtype, device)
        # Agreement is the forward pass's argmax, as `generate` picks: a tie picks the lower id.
        picked, gap = logits.argmax(-1), choice_gaps(logits, ours)
        differs = picked != torch.tensor(ours)
        agree += len(ours) - int(differs.sum())
        gaps.append(float(gap.max()))
        for position in differs.nonzero().flatten().tolist():
            disagreements.append(
                {
                    "session": session,
                    "position": position,
                    "engine": ours[position],
                    "transformers": int(picked[position]),
                    "gap_std": float(f"{gap[position]:.3g}"),
                    "ties": int((logits[position] == logits[position].max()).sum()),
                }
            )
    # transformers against itself: its one-pass forward over generate's own tokens. Where
    # rounding decides near-ties, the two disagree as well; this is the bar for the engine.
    self_agree = sum(
        int((teacher_forced_logits(path, audio, own, dtype, device).argmax(-1) == torch.tensor(own)).sum())
        for audio, own in zip(audios, tokens, strict=True)
    )
    return {
        "tokens": tokens,
        "generate_self_agreement": self_agree / sum(map(len, tokens)),
        "teacher_forced_agreement": agree / sum(map(len, engine_tokens)),
        "teacher_forced_max_gap_std": float(f"{max(gaps):.3g}"),
        "disagreements": disagreements[:5],
        "peak_rss_mb": round(peak_rss_mb()),
    }


def memory_bandwidth_gb_s(threads: int, device: str) -> float:
    """Best of 5 reads of a 1 GiB tensor (a sum: one pass, nothing written)."""
    torch.set_num_threads(threads)
    data = torch.ones(2**28, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        data.sum().item()  # .item(): the read is done
        best = min(best, time.perf_counter() - started)
    return data.nbytes / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/voxtral-4b-random"))
    parser.add_argument("--seconds", type=float, default=2.0, help="speech per session")
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    each = int(args.seconds * 16_000)
    audio = speech(args.sessions * args.seconds)
    audios = [audio[i * each : (i + 1) * each] for i in range(args.sessions)]
    if not (args.checkpoint / "config.json").is_file():
        started = time.perf_counter()
        isolated(build, args.checkpoint)
        print(f"built {args.checkpoint} in {time.perf_counter() - started:.0f} s", flush=True)
    engine = isolated(run_engine, args.checkpoint, audios, args.threads, args.dtype, args.device)
    ours = engine.pop("tokens")
    together = ours[str(args.sessions)]
    reference = isolated(
        run_reference, args.checkpoint, audios, together, args.threads, args.dtype, args.device
    )
    bandwidth = isolated(memory_bandwidth_gb_s, args.threads, args.device)
    expected = reference["tokens"]
    weight_bytes = engine.pop("weight_bytes")
    result = {
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "sessions": args.sessions,
        "seconds_per_session": args.seconds,
        "weights_gb": round(weight_bytes / 1e9, 2),
        "tokens_equal_generate": ours["1"] == expected[:1] and together == expected,
        "first_difference": [first_difference(a, b) for a, b in zip(together, expected, strict=True)],
        "tokens_varied": all(len(set(t)) >= 8 for t in expected),
        "positions_compared": sum(len(t) for t in expected),
        "teacher_forced_agreement": round(reference["teacher_forced_agreement"], 4),
        "generate_self_agreement": round(reference["generate_self_agreement"], 4),
        "teacher_forced_max_gap_std": reference["teacher_forced_max_gap_std"],
        "teacher_forced_disagreements": reference["disagreements"],
        **engine,
        "reference_peak_rss_mb": reference["peak_rss_mb"],
        "memory_bandwidth_gb_s": round(bandwidth, 1),
        "weight_read_floor_ms_per_step": round(weight_bytes / (bandwidth * 1e9) * 1000, 1),
    }
    print(json.dumps(result))


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
        None if len(a) == len(b) else min(map(len, (a, b))),
    )


if __name__ == "__main__":
    main()
