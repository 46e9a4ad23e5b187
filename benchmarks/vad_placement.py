"""Where Silero VAD runs beside Voxtral's device worker: the engine thread, the worker, or nowhere.

Prints one JSON line. With Voxtral two threads may run torch at once: the device worker runs
step N while the engine thread runs the VAD's batched call for step N+1. Two OpenMP teams on
two cores slow every step, so this measures the VAD where the engine runs it (`engine`),
handed to the device worker and waited for (`worker`: one thread runs all torch work), and
not run at all (`off`: its whole cost). Each placement runs in a fresh engine on the same
random checkpoint, in rounds (engine, worker, off, engine, ...) so that drift in the
machine's speed spreads over all three; per placement, the mean step time of each round.
`--size small` is the 40M checkpoint of `engine_throughput` (a step of about 45 ms),
`--size medium` about 300M (a step of about 190 ms).
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.engine_throughput import SPEC, speech
from realtime.engine.config import EngineConfig
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from tests.fixtures.tiny_voxtral import TinyVoxtralSpec, build_tiny_voxtral
from voxtral.loading import LoadedModel, load_model
from voxtral.vad import VadStream

SIZES = {
    "small": SPEC,
    "medium": TinyVoxtralSpec(
        audio_hidden=768, audio_layers=8, audio_heads=12, audio_window=750,
        text_hidden=1024, text_layers=8, text_heads=16, text_kv_heads=4, text_window=8192,
    ),
}  # fmt: skip
PLACEMENTS = ("engine", "worker", "off")


def skip_vad(streams: list[VadStream]) -> list[np.ndarray]:
    """No frame read: the audio is dropped unheard."""
    for stream in streams:
        stream.unread = stream.unread[:0]
    return [np.zeros(0, np.float32) for _ in streams]


def mean_step_ms(loaded: LoadedModel, placement: str, sessions: int, steps: int, audio: np.ndarray) -> float:
    """Mean wall time of a step once warm, each session fed one position's audio per step."""
    engine = Engine(loaded.runner, EngineConfig(max_sessions=sessions))
    probabilities = engine.vad.probabilities
    if placement == "worker":
        engine.vad.probabilities = lambda streams: loaded.runner._worker.submit(
            probabilities, streams
        ).result()
    elif placement == "off":
        engine.vad.probabilities = skip_vad
    for s in range(sessions):
        engine.add_utterance(f"s{s}")
    per = loaded.runner.spec.samples_per_position
    times = []
    for step in range(steps):
        started = time.perf_counter()
        for s in range(sessions):  # each session at its own place in the speech
            at = (step * per + s * 16_000) % (len(audio) - per)
            engine.add_audio(f"s{s}", audio[at : at + per])
        engine.run_once()
        times.append(time.perf_counter() - started)
    for s in range(sessions):
        engine.abort(f"s{s}")
    engine.run_once()
    return float(np.mean(times[steps // 5 :])) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    path = build_tiny_voxtral(Path(tempfile.mkdtemp()) / "checkpoint", SIZES[args.size])
    loaded = load_model(str(path), "cpu", "float32", max_sessions=args.sessions)
    audio = speech(10.0)
    rounds: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
    for _ in range(args.rounds):
        for placement in PLACEMENTS:
            ms = mean_step_ms(loaded, placement, args.sessions, args.steps, audio)
            rounds[placement].append(round(ms, 1))
    print(
        json.dumps({"size": args.size, "sessions": args.sessions, "threads": args.threads, "step_ms": rounds})
    )


if __name__ == "__main__":
    main()
