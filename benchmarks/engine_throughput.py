"""Voxtral Realtime throughput: the batched engine against `generate`, one session after another.

Prints one JSON line. A random checkpoint of about 40M parameters (tekken's full
vocabulary, tied) is built in a temporary directory; every session transcribes the
same length of speech (clients/samples/welcome.wav), given all at once, so the
figure is compute throughput, not real-time pacing. Positions are decoder positions
(80 ms of audio each). `outside_model_share` is the share of wall time the device
worker was not running model code (host work not hidden by the two-step pipeline);
the largest batch is also run with one step in flight, to show what the overlap hides.

Baseline: what a user writes today with transformers, the documented streaming
recipe: the processor's first chunk, then an `input_features` generator that runs the
processor on each overlapping 80 ms window, into `model.generate`, session by session.
"""

import argparse
import json
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from transformers import AutoProcessor, VoxtralRealtimeForConditionalGeneration

from clients.audio import load_audio_file
from realtime.engine.config import EngineConfig
from realtime.engine.events import Done
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from tests.engine_events import listen
from tests.fixtures.tiny_voxtral import TinyVoxtralSpec, build_tiny_voxtral
from voxtral.loading import load_model

SAMPLE = Path(__file__).resolve().parent.parent / "clients" / "samples" / "welcome.wav"
# About 40M parameters, 33.5M of them the tied 131,072 x 256 embedding; real windows.
SPEC = TinyVoxtralSpec(
    audio_hidden=256, audio_layers=4, audio_heads=4, audio_window=750,
    text_hidden=256, text_layers=4, text_heads=8, text_kv_heads=2, text_window=8192,
)  # fmt: skip


def speech(seconds: float) -> np.ndarray:
    audio = load_audio_file(SAMPLE)[: int(seconds * 16_000)]
    return (np.round(audio * 32768) / 32768).astype(np.float32)


def run_engine(path: Path, audio: np.ndarray, sessions: int, device: str, in_flight: int) -> dict:
    loaded = load_model(str(path), device, "float32", max_sessions=sessions)
    loaded.runner.spec = replace(loaded.runner.spec, max_steps_in_flight=in_flight)
    engine = Engine(loaded.runner, EngineConfig(max_sessions=sessions))
    events = listen(engine, {f"s{i}": [] for i in range(sessions)})
    # Timed from the first audio handed over, as the baseline is: features, prompt and all.
    started = time.perf_counter()
    for utterance_id in events:
        engine.add_utterance(utterance_id)
        engine.add_audio(utterance_id, audio)
        engine.finish_input(utterance_id)
    engine.run_once()  # applies the commands: every session's audio is on its timeline
    requests = dict(engine.scheduler.requests)
    while not all(sink and isinstance(sink[-1], Done) for sink in events.values()):
        engine.run_once()
    wall = time.perf_counter() - started
    positions = sum(request.num_computed for request in requests.values())
    return {
        "positions_per_s": positions / wall,
        "wall_s": wall,
        "steps": engine.num_steps,
        "outside_model_share": max(0.0, 1 - engine.model_seconds / wall),
        "tokens": requests["s0"].output_token_ids,
    }


def baseline_session(model, processor, audio: np.ndarray) -> tuple[int, list[int]]:
    """Decoder positions run and the tokens generated, for one session, on the model's device."""
    device, dtype = model.device, model.dtype
    per_token = processor.raw_audio_length_per_tok
    audio = np.pad(audio, (0, processor.num_right_pad_tokens * per_token))
    first = processor(
        audio[: processor.num_samples_first_audio_chunk],
        is_streaming=True,
        is_first_audio_chunk=True,
        return_tensors="pt",
    )

    def features():
        yield first.input_features.to(device, dtype)
        hop = processor.feature_extractor.hop_length
        start = processor.num_mel_frames_first_audio_chunk * hop - processor.feature_extractor.win_length // 2
        while start + processor.num_samples_per_audio_chunk <= len(audio):
            chunk = audio[start : start + processor.num_samples_per_audio_chunk]
            yield processor(
                chunk, is_streaming=True, is_first_audio_chunk=False, return_tensors="pt"
            ).input_features.to(device, dtype)
            start += per_token

    with torch.no_grad():
        out = model.generate(
            input_ids=first.input_ids.to(device),
            attention_mask=first.attention_mask.to(device),
            input_features=features(),
            num_delay_tokens=first.num_delay_tokens,
            do_sample=False,
        )
    # The last token is never fed back: one position fewer than the sequence.
    return out.shape[1] - 1, out[0, first.input_ids.shape[1] :].tolist()


def run_baseline(
    path: Path, audio: np.ndarray, sessions: int, device: str = "cpu", dtype: str = "auto"
) -> dict:
    model = VoxtralRealtimeForConditionalGeneration.from_pretrained(path, dtype=dtype).to(device).eval()
    processor = AutoProcessor.from_pretrained(path)
    started = time.perf_counter()
    outputs = [baseline_session(model, processor, audio) for _ in range(sessions)]
    wall = time.perf_counter() - started
    positions = sum(n for n, _ in outputs)
    return {"positions_per_s": positions / wall, "wall_s": wall, "tokens": outputs[0][1]}


def isolated(fn, *args):
    """Run in a fresh process: one OpenMP thread team per process, as in `voxrt serve`.

    A process that has run torch kernels on two threads keeps two teams, and libgomp
    throttles both once they outnumber the cores: no measurement may inherit that.
    """
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def setup(threads: int) -> None:
    configure_logging("warning")
    torch.set_num_threads(threads)


def measure_engine(
    path: Path, audio: np.ndarray, sessions: int, device: str, threads: int, in_flight: int
) -> dict:
    setup(threads)
    return run_engine(path, audio, sessions, device, in_flight)


def measure_baseline(path: Path, audio: np.ndarray, sessions: int, threads: int) -> dict:
    setup(threads)
    return run_baseline(path, audio, sessions)


def build(path: Path) -> int:
    build_tiny_voxtral(path, SPEC)
    return sum(p.numel() for p in VoxtralRealtimeForConditionalGeneration.from_pretrained(path).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1,4,16", help="concurrent sessions to measure")
    parser.add_argument("--seconds", type=float, default=8.0, help="speech per session")
    parser.add_argument("--baseline-sessions", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    audio = speech(args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt"
        num_params = isolated(build, path)
        baseline = isolated(measure_baseline, path, audio, args.baseline_sessions, args.threads)
        ours = {
            n: isolated(measure_engine, path, audio, n, args.device, args.threads, 2)
            for n in map(int, args.sessions.split(","))
        }
        # The same run with each step completed before the next is prepared: no overlap.
        most = max(ours)
        sync = isolated(measure_engine, path, audio, most, args.device, args.threads, 1)
    result = {
        "device": args.device,
        "threads": args.threads,
        "params_m": round(num_params / 1e6, 1),
        "seconds_per_session": args.seconds,
        "baseline_positions_per_s": round(baseline["positions_per_s"], 1),
    }
    for n, figures in ours.items():
        result[f"positions_per_s_{n}"] = round(figures["positions_per_s"], 1)
        result[f"outside_model_share_{n}"] = round(figures["outside_model_share"], 3)
        result[f"ms_per_step_{n}"] = round(figures["wall_s"] / figures["steps"] * 1000, 2)
    for n, figures in ours.items():
        result[f"speedup_{n}_over_baseline"] = round(
            figures["positions_per_s"] / baseline["positions_per_s"], 2
        )
    result[f"positions_per_s_{most}_one_step_in_flight"] = round(sync["positions_per_s"], 1)
    result[f"outside_model_share_{most}_one_step_in_flight"] = round(sync["outside_model_share"], 3)
    first = next(iter(ours.values()))["tokens"]
    result["tokens_equal_across_batch_sizes"] = all(f["tokens"] == first for f in ours.values())
    result["baseline_tokens_equal"] = baseline["tokens"] == first
    print(json.dumps(result))


if __name__ == "__main__":
    main()
