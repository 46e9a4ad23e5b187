"""Voxtral Realtime at its published size on one device: a step's time as sessions are added.

Prints one JSON line per count of sessions, then one for the baseline. `voxtral_real_size`'s
random checkpoint of the published configuration (built into `--checkpoint` if missing) is
loaded as `voxrt serve --model DIR --device D --dtype T` loads it. The sessions start
together, each streaming its own stretch of the bundled speech, one 80 ms piece per engine
step and no clock: a step adds 80 ms of audio to every session, so that many sessions keep
up with real time while the engine's period (from one step's results to the next) is at most
80 ms. Only steps that sample a token for every session count (not the prompt's).

Per line: the period and the device worker's time per step, the engine thread's CPU time per
step (ingest, log-mel, scheduling, delivery: host work a faster device does not remove; these
sessions, as on vLLM's wire, ask for no turns and skip the VAD),
positions per second, whether the sessions keep up, the device memory a session's KV-ring
slot takes and the most the run allocated; on CUDA, the share of the run's device time span
in which no kernel or copy ran (from a second run of the same sessions under torch's profiler,
`--profile-sessions`).
`--switch-interval` sets Python's (`sys.setswitchinterval`): how long the device worker may
wait for the GIL while the engine thread runs Python, each time it takes it back after a
blocking call.

Counts above the slots that fit the device's memory are reported as not fitting. Baseline:
the documented streaming recipe into `generate` (`engine_throughput.baseline_session`),
session after session, on the same device and dtype.

    python -m benchmarks.voxtral_sessions --device cuda --sessions 1,8,32,64,128,256
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.engine_throughput import isolated, run_baseline, speech
from benchmarks.voxtral_real_size import build
from realtime.engine.config import EngineConfig
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from tests.voxtral_harness import Feed, drive, pieces
from voxtral.audio import SAMPLE_RATE
from voxtral.loading import load_model

POSITION_SECONDS = 0.08  # the audio one decoder position covers


def session_audio(count: int, seconds: float) -> list[np.ndarray]:
    """`count` stretches of the bundled speech, each starting half a second after the last."""
    sample = speech(60.0)
    each = int(seconds * SAMPLE_RATE)
    room = len(sample) - each
    return [sample[(i * SAMPLE_RATE // 2) % room :][:each] for i in range(count)]


def run_sessions(engine: Engine, audios: list[np.ndarray]) -> dict:
    marks: list[tuple[float, float, int]] = []
    engine.on_step = lambda seconds, sessions: marks.append((time.perf_counter(), seconds, sessions))
    host_started = time.thread_time()  # `drive` steps the engine on this thread
    drive(engine, {f"{len(audios)}-{i}": Feed(pieces(audio, "80ms")) for i, audio in enumerate(audios)})
    host_seconds = time.thread_time() - host_started
    engine.on_step = None
    full = [(at, seconds) for at, seconds, sessions in marks if sessions == len(audios)]
    period = float(np.median(np.diff([at for at, _ in full])))
    return {
        "steps": len(full),
        "ms_per_step": round(1000 * period, 2),
        "model_ms_per_step": round(1000 * float(np.median([seconds for _, seconds in full])), 2),
        "engine_thread_cpu_ms_per_step": round(1000 * host_seconds / len(marks), 2),
        "positions_per_s": round(len(audios) / period, 1),
        "keeps_up": period <= POSITION_SECONDS,
    }


def device_events(prof: profile) -> list:
    """The kernels and copies a profiled run put on the GPU."""
    events = prof.profiler.kineto_results.events()
    return [event for event in events if event.device_type() == torch.autograd.DeviceType.CUDA]


def busy_ns(events: list) -> tuple[int, int]:
    """Nanoseconds the GPU ran any of `events` (the union of their spans), and the span from
    the first's start to the last's end."""
    spans = sorted((event.start_ns(), event.start_ns() + event.duration_ns()) for event in events)
    busy, reach = 0, spans[0][0]
    for start, end in spans:
        busy += max(0, end - max(start, reach))
        reach = max(reach, end)
    return busy, reach - spans[0][0]


def idle_share(engine: Engine, audios: list[np.ndarray]) -> float:
    """Share of the span from the run's first kernel to its last in which the GPU ran nothing."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        drive(engine, {f"p-{i}": Feed(pieces(audio, "80ms")) for i, audio in enumerate(audios)})
    busy, span = busy_ns(device_events(prof))
    return 1 - busy / span


def measure(args: argparse.Namespace, counts: list[int]) -> None:
    configure_logging("warning")
    sys.setswitchinterval(args.switch_interval)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    loaded = load_model(str(args.checkpoint), args.device, args.dtype, max_sessions=max(counts))
    model = loaded.runner.model
    engine = Engine(loaded.runner, EngineConfig(max_sessions=loaded.max_sessions))
    common = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "dtype": args.dtype,
        "seconds_per_session": args.seconds,
        "weights_gb": round(sum(p.numel() * p.element_size() for p in model.model.parameters()) / 1e9, 2),
        "slot_mb": round(model.slot_bytes / 2**20, 1),
        "slots": loaded.max_sessions,
        "switch_interval_s": sys.getswitchinterval(),
    }
    # Warm first (allocator, first kernels): no count pays it.
    drive(engine, {"warm-up": Feed(pieces(session_audio(1, 1.0)[0], "80ms"))})
    for count in counts:
        if count > loaded.max_sessions:
            print(json.dumps({"sessions": count, **common, "fits": False}), flush=True)
    fitting = [count for count in counts if count <= loaded.max_sessions]
    if len(fitting) < len(counts):
        fitting.append(loaded.max_sessions)  # the most that fit
    for count in fitting:
        audios = session_audio(count, args.seconds)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        line = {"sessions": count, **common, "fits": True} | run_sessions(engine, audios)
        if cuda:
            line["peak_allocated_gb"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
        if cuda and count == args.profile_sessions:
            line["gpu_idle_share"] = round(idle_share(engine, audios), 3)
        print(json.dumps(line), flush=True)


def baseline(args: argparse.Namespace) -> dict:
    configure_logging("warning")
    audio = session_audio(1, args.seconds)[0]
    figures = run_baseline(args.checkpoint, audio, args.baseline_sessions, args.device, args.dtype)
    return {
        "baseline": "generate, session after session",
        "device": args.device,
        "dtype": args.dtype,
        "sessions": args.baseline_sessions,
        "positions_per_s": round(figures["positions_per_s"], 1),
        "sessions_kept_up": round(figures["positions_per_s"] * POSITION_SECONDS, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/voxtral-4b-random"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--sessions", default="1,8,32,64,128,256")
    parser.add_argument("--seconds", type=float, default=3.0, help="speech per session")
    parser.add_argument("--profile-sessions", type=int, default=64)
    parser.add_argument("--baseline-sessions", type=int, default=2)
    parser.add_argument("--switch-interval", type=float, default=sys.getswitchinterval(), help="seconds")
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        isolated(build, args.checkpoint)
    isolated(measure, args, [int(n) for n in args.sessions.split(",")])
    print(json.dumps(isolated(baseline, args)), flush=True)


if __name__ == "__main__":
    main()
