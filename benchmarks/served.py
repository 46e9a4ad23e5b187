"""Builds of `voxrt serve` side by side, each in a process of its own, under real-time sessions
of real speech: what a session costs the server, and what its users see.

Each build is a checkout with its own virtual environment (`git worktree add DIR COMMIT` and
`bash DIR/scripts/setup.sh`), started as `voxrt serve` by its own environment's Python
(`tests/server_harness.ServerProcess`) with default flags and any given. For each number of
arrivals, each build in turn gets a fresh server and the same
sessions: each streams its own passage of the real recordings (`benchmarks/real_speech.py`:
its own order, pauses and faint noise), or with `--speech synthetic` its own passage of
synthetic voices (`benchmarks/speech.py`), cut to `--seconds`, in 100 ms chunks paced like a
microphone, arriving `ARRIVAL_SECONDS` apart, from a client process of their own; a refused
session does not retry. `--neighbour S` starts, `--neighbour-at` seconds into the run, one
process per core that burns it for S seconds: a noisy neighbour on a shared node.

Prints one JSON line: per build and number of arrivals, sessions seated and kept up (final
text within `KEPT_UP_SECONDS` of the audio's end); the server's CPU seconds per second of
audio it was sent (user + system, model load excluded); per word, from its end in the audio
(tiny.en's forced alignment) to when it appeared and stayed, committed p50/p95 and shown
(committed + interim) p95; the latest word; the longest time any session went without an
event, and with a neighbour how long after it left every word spoken by then was on screen
(the longest of the sessions still going); WER against each passage's text (for a recording
without a kept reference, the served model's offline words).

    .venv/bin/python -m benchmarks.served --build base=DIR --build this=. \
        [--build 'this-2t=.|--threads 2'] [--arrivals 1,4,8,16] [--seconds 40] [--neighbour 6]
        [--speech real|synthetic]
"""

import argparse
import itertools
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.client_process import ClientProcess, Refused
from benchmarks.real_speech import real_passages
from benchmarks.speech import Passage, passage, tiny_en_models
from benchmarks.text import mean_wer, whisper_wer
from benchmarks.whisper_streaming import offline_texts, percentile, snapshots, stable_since, word_latencies
from clients.connection import StreamedUtterance
from tests.server_harness import ServerProcess
from voxtral.audio import SAMPLE_RATE

ARRIVAL_SECONDS = 0.5
KEPT_UP_SECONDS = 1.0
SESSION_SECONDS = 40.0  # of each session's passage, unless `--seconds` says otherwise


@dataclass(frozen=True)
class Build:
    name: str
    root: Path
    flags: list[str]
    env: dict[str, str]  # set for its server

    @classmethod
    def parse(cls, spec: str) -> "Build":
        """NAME=DIR, or NAME=DIR|FLAGS, where FLAGS may start with VARIABLE=VALUE words."""
        name, _, rest = spec.partition("=")
        root, _, words = rest.partition("|")
        env = dict(w.split("=", 1) for w in words.split() if "=" in w and not w.startswith("-"))
        flags = [w for w in words.split() if not ("=" in w and not w.startswith("-"))]
        return cls(name, Path(root).resolve(), flags, env)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cut(p: Passage, seconds: float) -> Passage:
    """The first `seconds` of `p`, with the words that end in them."""
    words = [i for i, end in enumerate(p.word_ends) if end <= seconds]
    return replace(
        p,
        audio=p.audio[: round(seconds * SAMPLE_RATE)],
        words=[p.words[i] for i in words],
        word_ends=[p.word_ends[i] for i in words],
        text=" ".join(p.words[i] for i in words),
    )


def neighbour(seconds: float) -> list[subprocess.Popen]:
    """A process per core, each burning it for `seconds`."""
    burn = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen(["python3", "-c", burn]) for _ in range(os.cpu_count() or 1)]


def event_times(utterance: StreamedUtterance) -> list[float]:
    """When its events came, in seconds since its start, up to `done`."""
    times = sorted([t for t, _ in utterance.deltas] + [t for t, _ in utterance.interims])
    return times + ([utterance.done_at] if utterance.done_at is not None else [])


def longest_silence(utterance: StreamedUtterance) -> float:
    """The longest time between events, from the first to `done`."""
    return max((b - a for a, b in itertools.pairwise(event_times(utterance))), default=0.0)


def caught_up(
    p: Passage, utterance: StreamedUtterance, shown_at: list[tuple[float, str]], at: float
) -> float | None:
    """Seconds from `at` (`time.monotonic()`, any process's) until every word of `p` spoken by
    then was shown to stay in `shown_at` (0 if all were by `at`); None if the utterance was done
    by then. Words spoken later are not waited for: a turn starting just after `at` has its first
    word's latency, as any turn does. A word never shown (heard as another) is not waited for."""
    heard = at - utterance.started_at
    if utterance.done_at is not None and utterance.done_at <= heard:
        return None
    shown = stable_since(p.words, shown_at)
    return max([0.0, *(t - heard for j, t in shown.items() if p.word_ends[j] <= heard)])


def run(build: Build, passages: list[Passage], clients: ClientProcess, burst: float, burst_at: float) -> dict:
    server = ServerProcess(*build.flags, checkout=build.root, env=build.env)
    try:
        before = cpu_seconds(server.process.pid)
        burst_ended: list[float] = []
        if burst:

            def burn() -> None:
                for burner in neighbour(burst):
                    burner.wait()
                burst_ended.append(time.monotonic())

            # The clients stream from their process while this one waits to start the burst.
            timer = threading.Timer(burst_at, burn)
            timer.start()
        audios = [p.audio for p in passages]
        arrivals = clients.stream_sessions(server.url, audios, interim=True, arrival_seconds=ARRIVAL_SECONDS)
        used = cpu_seconds(server.process.pid) - before
        if burst:
            timer.join()
    finally:
        server.stop()
    results = [(p, a.result) for p, a in zip(passages, arrivals, strict=True)]
    seated = [(p, result) for p, result in results if not isinstance(result, Refused)]
    committed, shown, lags, waits = [], [], [], []
    for p, result in seated:
        committed_at, shown_at = snapshots(result.deltas, result.interims)
        committed += word_latencies(p, committed_at)
        shown += word_latencies(p, shown_at)
        lags.append((result.done_at or float("inf")) - len(p.audio) / SAMPLE_RATE)
        # Each session still going when the neighbour left: how long its words took to catch up.
        waits += [w for at in burst_ended if (w := caught_up(p, result, shown_at, at)) is not None]
    audio_seconds = sum(len(p.audio) for p, _ in seated) / SAMPLE_RATE
    return {
        "build": build.name,
        "arrivals": len(passages),
        "seated": len(seated),
        "kept_up": sum(lag <= KEPT_UP_SECONDS for lag in lags),
        "cpu_s_per_audio_s": round(used / audio_seconds, 3) if audio_seconds else None,
        "committed_p50_s": percentile(committed, 50),
        "committed_p95_s": percentile(committed, 95),
        "shown_p95_s": percentile(shown, 95),
        "latest_word_s": round(max(committed), 2) if committed else None,
        "longest_silence_s": round(max(longest_silence(r) for _, r in seated), 2) if seated else None,
        "caught_up_s": round(max(waits), 2) if waits else None,
        "wer": mean_wer(whisper_wer, [p.text for p, _ in seated], [r.text for _, r in seated])
        if seated
        else None,
        "errors": sum(len(r.errors) for _, r in seated),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", action="append", required=True, help="NAME=DIR or NAME=DIR|FLAGS")
    parser.add_argument("--arrivals", default="1,4,8,16")
    parser.add_argument("--seconds", type=float, default=SESSION_SECONDS, help="of each session's passage")
    parser.add_argument("--neighbour", type=float, default=0.0, help="seconds the neighbour burns the cores")
    parser.add_argument("--neighbour-at", type=float, default=15.0)
    parser.add_argument("--speech", choices=("real", "synthetic"), default="real")
    args = parser.parse_args()
    builds = [Build.parse(spec) for spec in args.build]
    counts = [int(n) for n in args.arrivals.split(",")]
    model, timing = tiny_en_models()
    if args.speech == "real":
        passages = real_passages(timing, lambda audio: offline_texts(model, [audio])[0], max(counts))
    else:
        passages = [passage(timing, index) for index in range(max(counts))]
    everyone = [cut(p, args.seconds) for p in passages]
    rows = []
    with ClientProcess() as clients:
        for round_, count in enumerate(counts):
            # Builds take turns going first: a machine's speed drifts over a run.
            order = builds if round_ % 2 == 0 else builds[::-1]
            for build in order:
                rows.append(run(build, everyone[:count], clients, args.neighbour, args.neighbour_at))
    settings = {
        "speech": args.speech,
        "seconds": args.seconds,
        "neighbour": args.neighbour,
        "neighbour_at": args.neighbour_at,
    }
    builds_out = {
        b.name: {"root": str(b.root), "flags": b.flags, "env": b.env, "commit": commit(b.root)}
        for b in builds
    }
    print(json.dumps({"settings": settings, "builds": builds_out, "rows": rows}))


def commit(root: Path) -> str:
    """The checkout's commit, marked where its tracked files changed since."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "-uno") else "")


if __name__ == "__main__":
    main()
