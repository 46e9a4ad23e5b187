"""Builds of `voxrt serve` started side by side: how long until it is ready, the CPU that took,
and its resident memory then, the builds taking turns for `--rounds` rounds.

Each build is a checkout started by its own environment's Python, with default flags and any
given (`benchmarks.served`'s `--build`). Ready is `/health/ready` answering 200: the model
loaded and its full window timed. Prints one JSON line: per build, the median of each figure.

    .venv/bin/python -m benchmarks.server_start --build base=DIR --build this=. [--rounds 5]
"""

import argparse
import json
import statistics
import time

from benchmarks.served import Build, cpu_seconds
from tests.server_harness import ServerProcess, resident_mb


def start_once(build: Build) -> dict[str, float]:
    started = time.monotonic()
    server = ServerProcess(*build.flags, checkout=build.root, env=build.env)
    try:
        ready = time.monotonic() - started
        pid = server.process.pid
        return {"ready_s": ready, "cpu_s": cpu_seconds(pid), "rss_mb": resident_mb(pid)}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="append", type=Build.parse, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {b.name: [] for b in args.build}
    for _ in range(args.rounds):
        for build in args.build:
            runs[build.name].append(start_once(build))
    medians = {
        name: {key: round(statistics.median(r[key] for r in rows), 2) for key in rows[0]}
        for name, rows in runs.items()
    }
    print(json.dumps({"benchmark": "server_start", "rounds": args.rounds, "builds": medians}))


if __name__ == "__main__":
    main()
