"""Where a Whisper step's time goes: encoder and decoder milliseconds per step, without a clock.

`--sessions` passages of `benchmarks/speech.py` stream together through one engine, one
step per `--step` seconds of audio (0.7 s is about a step's audio at 4 real-time sessions),
so every run decodes the same windows; the model is loaded as `voxrt serve` loads it on a
CPU. Prints one JSON line: per step, encoder and decoder milliseconds; windows encoded and
their mean mel frames. Another build's cost: `PYTHONPATH=<its checkout>` with this file's path.

    .venv/bin/python -m benchmarks.whisper_step_cost [--sessions 4] [--step 0.7]
"""

import argparse
import json
import time
from collections.abc import Callable

import torch

from benchmarks.speech import passage, tiny_en_models
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.runner import WhisperRunner


def timed(function: Callable, seconds: list[float]) -> Callable:
    def call(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)

    return call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--step", type=float, default=0.7, help="seconds of audio per engine step")
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(2)
    model, timing = tiny_en_models()
    audio = [passage(timing, index).audio for index in range(args.sessions)]
    encodes: list[float] = []
    decodes: list[float] = []
    frames: list[int] = []
    encode = model.encode
    model.encode = timed(lambda features: frames.append(features.shape[-1]) or encode(features), encodes)
    model.decode = timed(model.decode, decodes)
    engine = Engine(WhisperRunner(model))
    for index in range(args.sessions):
        engine.add_utterance(f"u{index}")
    step = round(args.step * SAMPLE_RATE)
    steps = 0
    for offset in range(0, min(len(a) for a in audio), step):
        for index, samples in enumerate(audio):
            engine.add_audio(f"u{index}", samples[offset : offset + step])
        engine.run_once()
        steps += 1
    print(
        json.dumps(
            {
                "sessions": args.sessions,
                "step_s": args.step,
                "steps": steps,
                "encoder_ms_per_step": round(1000 * sum(encodes) / steps, 1),
                "decoder_ms_per_step": round(1000 * sum(decodes) / steps, 1),
                "windows_encoded": len(encodes),
                "mean_mel_frames": round(sum(frames) / len(frames)),
            }
        )
    )


if __name__ == "__main__":
    main()
