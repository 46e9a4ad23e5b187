"""Where one Whisper window's time goes, on one thread (a lane's): the encoder and its share
in attention and in the linear layers, the decoder's cross-attention keys, its first pass,
and one token's pass split into the layers and the vocabulary projection.

tiny.en as `voxrt serve` loads it on this CPU (or with `--cpu-weights`); a window of
`--seconds` of audio with the tail's silence (`WhisperPolicy.encoder_frames`), `--read` tokens
in the first pass. The cost does not depend on what the audio says, so the window is silence.
Prints one JSON line of milliseconds (medians) and shares.

    .venv/bin/python -m benchmarks.whisper_parts [--seconds 10] [--read 30] [--cpu-weights int8]
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.speech import tiny_en_models
from voxtral.whisper.model import CPU_WEIGHTS
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.stream import POSITIONS_PER_SECOND


def median_ms(work: Callable[[], object], repeats: int) -> float:
    work()  # sets the kernels up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0, help="of audio in the window")
    parser.add_argument("--read", type=int, default=30, help="tokens of the first pass")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--cpu-weights", choices=CPU_WEIGHTS, help="(default: as `voxrt serve` on this CPU)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, _ = tiny_en_models(args.cpu_weights)
    frames = WhisperPolicy().encoder_frames(
        round(args.seconds * POSITIONS_PER_SECOND), POSITIONS_PER_SECOND, model.max_frames
    )
    features = torch.zeros(1, model.n_mels, frames)
    encoder_ms = median_ms(lambda: model.encode(features), args.repeats)
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        model.encode(features)
    kernels = {event.key: event.self_cpu_time_total for event in profiled.key_averages()}
    total = sum(kernels.values())
    attention = sum(t for key, t in kernels.items() if "scaled_dot_product" in key)
    linear = sum(kernels.get(key, 0) for key in ("quantized::linear_dynamic", "aten::addmm", "aten::mm"))
    states = model.encode(features)
    keys_ms = median_ms(lambda: model.steps.start(states, None, args.read + 1), args.repeats)
    ids = torch.full((1, args.read), model.eot)
    positions = torch.arange(args.read)[None]
    padding = torch.zeros_like(ids, dtype=torch.bool)

    def first_pass():
        cache = model.steps.start(states, None, args.read + 1)
        model.steps(cache, ids, positions, padding)
        return cache

    first_ms = median_ms(first_pass, args.repeats) - keys_ms
    cache = first_pass()
    token_repeats = 100
    hidden, _ = model.steps(cache, ids[:, -1:], positions[:, -1:], padding[:, -1:])

    def token_pass():
        cache.length = args.read  # the same column, each time: a pass's cost is not its place
        return model.steps(cache, ids[:, -1:], positions[:, -1:], padding[:, -1:])

    layers_ms = median_ms(token_pass, token_repeats)
    projection_ms = median_ms(lambda: model.model.proj_out(hidden[:, -1]), token_repeats)
    print(
        json.dumps(
            {
                "window_s": args.seconds,
                "mel_frames": frames,
                "encoder_ms": round(encoder_ms, 1),
                "encoder_attention_share": round(attention / total, 2),
                "cpu_weights": model.cpu_weights,
                "encoder_linear_share": round(linear / total, 2),
                "cross_keys_ms": round(keys_ms, 1),
                "first_pass_ms": round(first_ms, 1),
                "token_layers_ms": round(layers_ms, 2),
                "token_projection_ms": round(projection_ms, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
