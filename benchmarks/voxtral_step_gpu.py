"""Where a Voxtral step's time goes on a GPU: launched op by op, against a CUDA graph's replay.

For each of `--sessions`, one JSON line. The model (`voxtral_real_size`'s random checkpoint of
the published configuration, built into `--checkpoint` if missing) is loaded as `voxrt serve`
loads it, and its slots are filled by `--positions` steps of random log-mel, every session
one position a step, as streaming does. The next step (an encode and a decode for every
session) is then timed: run op by op as the engine runs it (host clock, synchronized), and
captured once into a CUDA graph and replayed. Reported: ms per step each way, whether the
replay's tokens equal the eager step's from the same state, the GPU's busy time per eager
step (torch's profiler: the union of its kernels and copies), the kernels launched per step,
and the kernels that take most of the busy time. CUDA only.

    python -m benchmarks.voxtral_step_gpu --sessions 1,8,64,100
"""

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.engine_throughput import isolated
from benchmarks.voxtral_real_size import build
from benchmarks.voxtral_sessions import busy_ns, device_events
from realtime.logs import configure_logging
from voxtral.voxtral_realtime.model import VoxtralModel
from voxtral.voxtral_realtime.sliding_kv import Rows


class Step:
    """One streaming step for slots 0..count-1 at decoder position `position`."""

    def __init__(self, model: VoxtralModel, count: int, position: int) -> None:
        slots, frames = list(range(count)), model.downsample
        self.model = model
        self.frames = Rows.build(slots, [position * frames] * count, [frames] * count, model.device)
        self.rows = Rows.build(slots, [position] * count, [1] * count, model.device)
        self.mels = torch.randn(count, model.n_mels, 2 * frames, device=model.device)

    def __call__(self) -> torch.Tensor:
        return self.model.decode(self.rows, self.model.encode(self.frames, self.mels))


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return 1000 * float(np.median(times))


def busy(step: Step, repeats: int) -> dict:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
    events = device_events(prof)
    total, _ = busy_ns(events)
    by_kernel: Counter[str] = Counter()
    for e in events:
        by_kernel[e.name()[:80]] += e.duration_ns()
    return {
        "gpu_busy_ms_per_step": round(total / repeats / 1e6, 2),
        "kernels_per_step": round(len(events) / repeats),
        "top_kernels_ms_per_step": {
            name: round(ns / repeats / 1e6, 3) for name, ns in by_kernel.most_common(8)
        },
    }


def replayed(step: Step, carried: tuple, before: list[torch.Tensor], eager_tokens: torch.Tensor) -> dict:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as capture wants
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replay_tokens = step()
    for state, saved in zip(carried, before, strict=True):
        state.copy_(saved)
    graph.replay()
    torch.cuda.synchronize()
    return {
        "graph_tokens_equal_eager": bool(torch.equal(replay_tokens, eager_tokens)),
        "graph_ms_per_step": round(median_ms(graph.replay, 20), 2),
    }


def measure(args: argparse.Namespace, counts: list[int]) -> None:
    configure_logging("warning")
    device = torch.device("cuda")
    model = VoxtralModel(args.checkpoint, device, getattr(torch, args.dtype), num_slots=max(counts))
    for count in counts:
        if count > model.num_slots:
            print(json.dumps({"sessions": count, "fits": False, "slots": model.num_slots}), flush=True)
            continue
        model.reset(torch.arange(count, device=device))
        with torch.no_grad():
            for position in range(args.positions):
                Step(model, count, position)()
            step = Step(model, count, args.positions)
            # A step moves the carried conv states and the fed-back tokens: the replay starts
            # from the state the eager step started from.
            carried = (model.conv1_state, model.conv2_state, model.last_token)
            before = [state.clone() for state in carried]
            eager_tokens = step().clone()
            eager_ms = median_ms(step, 10)
            line = {
                "sessions": count,
                "device": torch.cuda.get_device_name(device),
                "dtype": args.dtype,
                "position": args.positions,
                "eager_ms_per_step": round(eager_ms, 2),
                **busy(step, 5),
            }
            try:
                line |= replayed(step, carried, before, eager_tokens)
            except RuntimeError as exc:  # a step that cannot be captured says why
                line["graph_error"] = str(exc)[:300]
        print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/voxtral-4b-random"))
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--sessions", default="1,8,64,100")
    parser.add_argument("--positions", type=int, default=40, help="positions streamed before the step")
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        isolated(build, args.checkpoint)
    isolated(measure, args, [int(n) for n in args.sessions.split(",")])


if __name__ == "__main__":
    main()
