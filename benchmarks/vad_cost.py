"""What the VAD's batched call costs the engine thread: `Vad.probabilities` over `streams`
utterances holding `frames` new frames each, on one thread as the engine thread runs it.

A step of live speech reads about 16 frames a stream (0.5 s); a stream that waited out a stall
reads all it was sent meanwhile (`--frames 190`: 6 s). The audio is noise: the network's cost
does not depend on what it hears. Prints one JSON line of medians, milliseconds per call and
microseconds per frame read.

    .venv/bin/python -m benchmarks.vad_cost [--streams 1,4,16,64] [--frames 16,190]

The build before a change, in the same run: this file run in that build's tree with its own
venv (an editable install finds `voxtral` in its own tree whatever PYTHONPATH says).
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

from voxtral.vad import FRAME, Vad, VadStream


def ms_per_call(vad: Vad, streams: int, frames: int, repeats: int) -> float:
    noise = np.random.default_rng(0).normal(0, 0.1, frames * FRAME).astype(np.float32)
    times = []
    for _ in range(repeats + 1):  # the first sets the kernels up
        batch = [VadStream() for _ in range(streams)]
        for stream in batch:
            stream.feed(noise)
        started = time.perf_counter()
        vad.probabilities(batch)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,4,16,64")
    parser.add_argument("--frames", default="16,190")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    vad = Vad()
    rows = []
    for frames in [int(f) for f in args.frames.split(",")]:
        for streams in [int(s) for s in args.streams.split(",")]:
            ms = ms_per_call(vad, streams, frames, args.repeats)
            rows.append(
                {
                    "streams": streams,
                    "frames": frames,
                    "ms_per_call": round(ms, 2),
                    "us_per_frame": round(ms * 1000 / (streams * frames), 1),
                }
            )
    print(json.dumps({"benchmark": "vad_cost", "threads": 1, "rows": rows}))


if __name__ == "__main__":
    main()
