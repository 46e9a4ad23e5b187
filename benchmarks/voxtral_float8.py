"""Voxtral Realtime's KV rings in float8 against bfloat16 rings at the published size.

Prints one JSON line. `voxtral_real_size`'s random checkpoint of Voxtral-Mini-4B-Realtime-2602's
configuration (built into `--checkpoint` if missing), in bfloat16, streams `--seconds` of
speech one position a step, first on bfloat16 rings, then on float8 rings fed back the
bfloat16 run's tokens, so that each position's choice is judged on the same history.
Reported: bytes of rings per session each way, the share of positions whose choice changes
and how near a tie each was (the bfloat16 run's top-two gap, in standard deviations of its
logits), and the logits' drift (largest and median, in the same units).

    .venv/bin/python -m benchmarks.voxtral_float8 [--seconds 5] [--device cuda]
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.engine_throughput import isolated, speech
from benchmarks.voxtral_real_size import build
from realtime.logs import configure_logging
from tests.voxtral_harness import engine_log_mel
from voxtral.voxtral_realtime.model import VoxtralModel
from voxtral.voxtral_realtime.sliding_kv import Rows


def streamed_logits(
    model: VoxtralModel, mels: torch.Tensor, fed_back: list[int] | None = None
) -> torch.Tensor:
    """(positions, vocab) logits of slot 0 streamed one position a step, `mels` (positions, 1,
    n_mels, frames a position); `fed_back`: the tokens fed back after each step instead of the
    model's own choices, so that two models are judged on one history."""
    logits: list[torch.Tensor] = []
    hook = model.model.lm_head.register_forward_hook(lambda _, __, out: logits.append(out.float().cpu()))
    try:
        for position in range(len(mels)):
            encode = Rows.build([0], [position * model.downsample], [model.downsample], model.device)
            decode = Rows.build([0], [position], [1], model.device)
            model.decode(decode, model.encode(encode, mels[position].to(model.device)))
            if fed_back is not None:
                model.last_token[0] = fed_back[position]
    finally:
        hook.remove()
    return torch.cat(logits)


def run(path: Path, audio: np.ndarray, float8: bool, fed_back: list[int] | None, device: str) -> dict:
    configure_logging("warning")
    model = VoxtralModel(path, torch.device(device), torch.bfloat16, num_slots=1, float8_rings=float8)
    per = model.mel_frames_per_position
    mel = engine_log_mel(model.processor, audio)
    positions = mel.shape[-1] // per
    mels = mel[..., : positions * per].reshape(1, model.n_mels, positions, per).permute(2, 0, 1, 3)
    started = time.perf_counter()
    logits = streamed_logits(model, mels, fed_back)
    return {"logits": logits, "slot_bytes": model.slot_bytes, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/voxtral-4b-random"))
    parser.add_argument("--seconds", type=float, default=5.0, help="speech streamed")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        isolated(build, args.checkpoint)
    audio = speech(args.seconds)
    plain = isolated(run, args.checkpoint, audio, False, None, args.device)
    reference = plain["logits"]
    tokens = reference.argmax(-1)
    float8 = isolated(run, args.checkpoint, audio, True, tokens.tolist(), args.device)
    spread = reference.std(-1, keepdim=True)
    drift = ((float8["logits"] - reference).abs() / spread).amax(-1)
    changed = float8["logits"].argmax(-1) != tokens
    top2 = reference.topk(2, -1).values
    gaps = ((top2[:, 0] - top2[:, 1]) / spread[:, 0])[changed]
    result = {
        "device": args.device,
        "positions": len(tokens),
        "distinct_tokens": len(set(tokens.tolist())),
        "slot_mib": {
            "bfloat16": round(plain["slot_bytes"] / 2**20),
            "float8": round(float8["slot_bytes"] / 2**20),
        },
        "changed_share": round(float(changed.float().mean()), 4),
        "changed_top2_gap_std": [round(float(g), 3) for g in gaps],
        "drift_std_max": round(float(drift.max()), 3),
        "drift_std_median": round(float(drift.median()), 4),
        "seconds": {"bfloat16": round(plain["seconds"], 1), "float8": round(float8["seconds"], 1)},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
