"""Voxtral Realtime hours into a session: does a decode at a large position offset equal one at 0?

Prints one JSON line. Attention inside a sliding window depends only on position
differences, but each rotary angle is computed from an absolute position: hours into a
session those are large (12.5 text and 50 encoder positions a second), and an angle
rounded there is what the model computes. This runs the engine on the same speech with
every rotary angle computed as it would be `--hours` into a session (each stack at its
own rate, `tests/voxtral_harness.shift_positions`), the fed-back tokens forced to those of
the offset-0 run, so that every position's logits compare: their largest and mean
difference, and the share of positions whose top-1 token differs, against two floors: the offset-0 run
repeated, and the same speech one minute in (other angles, each still computed exactly).

The checkpoint is `benchmarks/voxtral_real_size.py`'s: random weights, Voxtral-Mini-4B-
Realtime's configuration (built into `--checkpoint` if missing).

    .venv/bin/python -m benchmarks.voxtral_positions [--dtype float32,bfloat16] [--hours 1,2,4,8]
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.engine_throughput import isolated, setup, speech
from benchmarks.voxtral_real_size import build
from realtime.engine.loop import Engine
from tests.voxtral_harness import Feed, drive, pieces, shift_positions, voxtral_engine


def decode_logits(engine: Engine, audio: np.ndarray, forced: list[int] | None) -> list[torch.Tensor]:
    """Every decode position's logits, each position's fed-back token forced to `forced`'s."""
    model = engine.runner.model
    logits: list[torch.Tensor] = []

    def record(module, inputs, output: torch.Tensor) -> torch.Tensor:
        logits.append(output[0].float().cpu())
        if forced is None:
            return output
        chosen = output.clone()
        chosen[0, forced[len(logits) - 1]] = output.max() + 1
        return chosen

    hook = model.model.lm_head.register_forward_hook(record)
    try:
        drive(engine, {f"run-{time.monotonic_ns()}": Feed(pieces(audio, "80ms"))})
    finally:
        hook.remove()
    return logits


def compare(logits: list[torch.Tensor], reference: list[torch.Tensor]) -> dict:
    ours, theirs = torch.stack(logits), torch.stack(reference[: len(logits)])
    difference = (ours - theirs).abs()
    return {
        "positions": len(logits),
        "max_logit_diff": float(f"{difference.max():.4g}"),
        "mean_logit_diff": float(f"{difference.mean():.4g}"),
        "top1_differs": round(float((ours.argmax(-1) != theirs.argmax(-1)).float().mean()), 4),
    }


def run(path: Path, audio: np.ndarray, dtype: str, hours: list[float], threads: int) -> dict:
    setup(threads)
    engine = voxtral_engine(path, max_sessions=1, dtype=dtype)
    model = engine.runner.model
    reference = decode_logits(engine, audio, None)
    tokens = [int(row.argmax()) for row in reference]
    out = {"logit_std": float(f"{torch.stack(reference).std():.4g}")}
    out["floor_repeat"] = compare(decode_logits(engine, audio, tokens), reference)
    # Other angles, all small enough to be computed exactly in float32: the rounding a dtype
    # shows wherever its angles fall, which no re-anchoring removes.
    shift_positions(model, 60)
    out["floor_one_minute"] = compare(decode_logits(engine, audio, tokens), reference)
    out["hours"] = {}
    for offset in hours:
        shift_positions(model, offset * 3600)
        out["hours"][str(offset)] = compare(decode_logits(engine, audio, tokens), reference)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/voxtral-4b-random"))
    parser.add_argument("--dtype", default="float32,bfloat16", help="comma-separated")
    parser.add_argument("--hours", default="1,2,4,8", help="offsets, comma-separated")
    parser.add_argument("--seconds", type=float, default=2.0, help="speech decoded")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        isolated(build, args.checkpoint)
    hours = [float(h) for h in args.hours.split(",")]
    audio = speech(args.seconds)
    result = {"checkpoint": str(args.checkpoint), "seconds": args.seconds}
    for dtype in args.dtype.split(","):
        result[dtype] = isolated(run, args.checkpoint, audio, dtype, hours, args.threads)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
