"""`voxrt soak`: N paced sessions for a while, sampling /metrics, then a report and a verdict."""

import argparse
import asyncio
import importlib.util
import json
import math
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.protocol import State

from clients.audio import SAMPLE_RATE, UnreadableAudio, distinct_audio, load_audio_file
from clients.connection import reopened, stream_utterance
from clients.openai_turns import RATE as OPENAI_RATE
from clients.openai_turns import stream_turns
from clients.soak_figures import (
    histogram_quantile,
    rss_growth_mb,
    rss_slope_mb_per_hour,
    scrape,
    worst_window_p95,
)
from clients.stream import DEFAULT_URL

SAMPLE = Path(__file__).resolve().parent / "samples" / "welcome.wav"


def parse_duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: use 90, 90s, 10m or 2h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--duration", type=parse_duration, default=parse_duration("10m"))
    parser.add_argument("--speed", type=float, default=1.0, help="pace at X times real time")
    parser.add_argument("--churn", action="store_true", help="end and reconnect after every file")
    parser.add_argument(
        "--wire",
        choices=("vllm", "openai"),
        default="vllm",
        help="vLLM's (one utterance per file) or OpenAI's (the server's VAD commits each turn)",
    )
    parser.add_argument("--audio", nargs="+", default=[str(SAMPLE)], metavar="FILE")
    parser.add_argument("--report", default=None, metavar="OUT.json")
    parser.add_argument("--plot", default=None, metavar="OUT.png")
    parser.add_argument("--sample-seconds", type=float, default=5.0, help="how often to read /metrics")
    parser.add_argument("--warmup", type=float, default=0.2, help="share of the run before RSS is judged")
    parser.add_argument(
        "--max-p95-latency", type=float, default=3.0, help="seconds, server delta latency, in every window"
    )
    parser.add_argument("--window", type=parse_duration, default=30.0, help="the span a stall is judged over")
    parser.add_argument("--max-rss-growth", type=float, default=200.0, help="MB after warm-up")
    parser.add_argument("--max-rss-slope", type=float, default=100.0, help="MB per hour after warm-up")
    parser.add_argument("--api-key", default=None)
    # Behind a balancer: each replica's http://host:port, for its /metrics (default: --url's server).
    parser.add_argument("--metrics", nargs="+", default=None, metavar="HTTP_BASE")


@dataclass
class SoakState:
    utterances: int = 0
    audio_seconds: float = 0.0
    deltas: int = 0
    errors: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)  # by HTTP status, each retried after Retry-After
    reconnects: int = 0  # after a drain (1001) or a shed (1013)
    sheds: int = 0
    final_latencies: list[float] = field(default_factory=list)


async def worker(
    i: int, args: argparse.Namespace, audios: list[np.ndarray], deadline: float, state: SoakState
):
    """One client: utterances until the deadline, on one connection (or one each with
    `--churn`), reconnecting like `voxrt stream` when a server is busy, drains or sheds."""
    turn = i  # sessions start on different files
    connection = None

    def refused(exc: InvalidStatus) -> None:
        state.refusals[exc.response.status_code] += 1

    url = args.url + ("?intent=transcription" if args.wire == "openai" else "")
    rate = OPENAI_RATE if args.wire == "openai" else SAMPLE_RATE
    while time.monotonic() < deadline:
        try:
            if connection is not None and connection.state is not State.OPEN:
                state.reconnects += 1
            connection = await reopened(
                connection, url, args.api_key, max(0.0, deadline - time.monotonic()), refused
            )
            if args.churn:
                samples = audios[turn % len(audios)]
            else:  # one long session: the files back to back until the deadline
                reps = max(1, int((deadline - time.monotonic()) * args.speed / (len(audios[0]) / rate)) + 1)
                samples = np.concatenate([audios[(turn + k) % len(audios)] for k in range(reps)])
            # Each session's audio, and each repeat of it, its own: caches are not flattered.
            samples = distinct_audio(samples, (i, turn))
            turn += 1
            sent_at = time.monotonic()
            if args.wire == "openai":
                turns = await stream_turns(connection, samples, 100, args.speed)
                errors, done, deltas = turns.errors, turns.done, turns.deltas
            else:
                result = await stream_utterance(connection, samples, 100, args.speed)
                errors, done, deltas = result.errors, result.done is not None, len(result.deltas)
            for error in errors:
                if error.get("code") == "server_overloaded":
                    state.sheds += 1
                else:
                    state.errors[error.get("code", "unknown")] += 1
            if done:
                state.final_latencies.append(time.monotonic() - sent_at - len(samples) / rate / args.speed)
                state.utterances += 1
                state.audio_seconds += len(samples) / rate
                state.deltas += deltas
            if args.churn:
                await connection.close()
                connection = None
        except InvalidStatus as exc:
            if exc.response.status_code == 503:  # still busy at the deadline: a refusal, not an error
                refused(exc)
            else:
                state.errors[f"refused:{exc.response.status_code}"] += 1
        except ConnectionClosed as exc:
            # A draining server (1001) or a shed (1013) between events: reconnect. Else an error.
            if exc.rcvd is None or exc.rcvd.code not in (1001, 1013):
                state.errors[f"connection:{type(exc).__name__}"] += 1
        except (OSError, WebSocketException, TimeoutError) as exc:
            state.errors[f"connection:{type(exc).__name__}"] += 1
            await asyncio.sleep(1.0)
    if connection is not None:
        await connection.close()


async def soak(args: argparse.Namespace, audios: list[np.ndarray]) -> dict:
    http_bases = args.metrics or [args.url.replace("ws", "http", 1).split("/v1/")[0]]
    state = SoakState()
    samples: list[dict] = []
    started = time.monotonic()
    deadline = started + args.duration
    first = previous = scrape(http_bases)
    scrapes = [(0.0, first)]  # (seconds into the run, values) for the windows' latency
    workers = [asyncio.create_task(worker(i, args, audios, deadline, state)) for i in range(args.sessions)]
    try:
        from tqdm import tqdm

        bar = tqdm(total=int(args.duration), unit="s", desc="soak", disable=not sys.stderr.isatty())
    except ImportError:
        bar = None
    while time.monotonic() < deadline:
        await asyncio.sleep(min(args.sample_seconds, max(0.0, deadline - time.monotonic())))
        now = scrape(http_bases)
        t = time.monotonic() - started
        scrapes.append((t, {k: v for k, v in now.items() if k.startswith("le=")}))
        samples.append(
            {
                "t": round(t, 2),
                "rss_mb": round(now.get("process_resident_memory_bytes", 0) / 2**20, 2),
                "sessions": now.get("voxrt_utterances_active", 0),
                "encoder_cache_rows": now.get("voxrt_encoder_cache_rows", 0),
                "feature_cache_hits": now.get("voxrt_feature_cache_hits_total", 0),
                "feature_cache_queries": now.get("voxrt_feature_cache_queries_total", 0),
                "p95_latency_s": histogram_quantile(previous, now, 0.95),
            }
        )
        previous = now
        if bar is not None:
            bar.n = min(int(t), int(args.duration))
            bar.set_postfix(
                sessions=int(now.get("voxrt_utterances_active", 0)), errors=sum(state.errors.values())
            )
            bar.refresh()
    await asyncio.gather(*workers)
    if bar is not None:
        bar.close()
    # All sessions have ended: every cache row they referenced must be back.
    end = scrape(http_bases)
    for _ in range(100):
        # The server's stats follow within a step.
        names = ("voxrt_utterances_active", "voxrt_engine_utterances", "voxrt_kv_slots_used")
        if all(end.get(name, 0) == 0 for name in names):
            break
        await asyncio.sleep(0.2)
        end = scrape(http_bases)
    warmup_until = args.duration * args.warmup
    quantiles = {q: histogram_quantile(first, end, q) for q in (0.5, 0.95, 0.99)}
    worst = worst_window_p95(scrapes, args.window)
    slope, slope_error = rss_slope_mb_per_hour(samples, warmup_until)
    return {
        "url": args.url,
        "sessions": args.sessions,
        "churn": args.churn,
        "duration_s": round(time.monotonic() - started, 1),
        "utterances": state.utterances,
        "audio_seconds": round(state.audio_seconds, 1),
        "deltas": state.deltas,
        "latency_s": {
            f"p{int(q * 100)}": (round(v, 3) if v is not None else None) for q, v in quantiles.items()
        },
        "worst_window": {
            "seconds": args.window,
            "p95_s": round(worst[0], 3),
            "ended_at_s": round(worst[1], 1),
        }
        if worst
        else None,
        "final_latency_s_p95": round(float(np.percentile(state.final_latencies, 95)), 3)
        if state.final_latencies
        else None,
        "errors": dict(state.errors),
        "refusals": {str(status): n for status, n in state.refusals.items()},
        "reconnects": state.reconnects,
        "sheds": state.sheds,
        "server_sheds": end.get("voxrt_sheds_total", 0) - first.get("voxrt_sheds_total", 0),
        "rss_mb": {
            "start": samples[0]["rss_mb"] if samples else None,
            "end": round(end["process_resident_memory_bytes"] / 2**20, 2),
        },
        "rss_growth_after_warmup_mb": round(rss_growth_mb(samples, warmup_until), 2),
        "rss_slope_mb_per_hour": round(slope, 2),
        # None: too few samples after the warm-up to fit a line through.
        "rss_slope_stderr_mb_per_hour": round(slope_error, 2) if math.isfinite(slope_error) else None,
        "encoder_cache_rows_after": end.get("voxrt_encoder_cache_rows", 0),
        "kv_slots_after": end.get("voxrt_kv_slots_used", 0),
        "feature_cache_hit_rate": round(
            (end.get("voxrt_feature_cache_hits_total", 0) - first.get("voxrt_feature_cache_hits_total", 0))
            / max(
                1.0,
                end.get("voxrt_feature_cache_queries_total", 0)
                - first.get("voxrt_feature_cache_queries_total", 0),
            ),
            3,
        ),
        "samples": samples,
    }


def verdict(report: dict, args: argparse.Namespace) -> list[str]:
    failures = []
    if report["errors"]:
        failures.append(f"errors: {report['errors']}")
    p95 = report["latency_s"]["p95"]
    if p95 is not None and p95 > args.max_p95_latency:
        failures.append(f"p95 delta latency {p95:.2f} s > {args.max_p95_latency} s")
    if (worst := report["worst_window"]) and worst["p95_s"] > args.max_p95_latency:
        failures.append(
            f"a stall: p95 delta latency {worst['p95_s']:.2f} s > {args.max_p95_latency} s over the"
            f" {worst['seconds']:.0f} s ending {worst['ended_at_s']:.0f} s into the run"
        )
    # Admission refuses at the door; an admitted session closed mid-sentence is a broken promise.
    if sheds := max(report["sheds"], report["server_sheds"]):
        failures.append(f"{sheds:.0f} admitted sessions shed")
    if report["encoder_cache_rows_after"] != 0:
        failures.append(
            f"{report['encoder_cache_rows_after']:.0f} encoder-cache rows still referenced "
            "after all sessions ended"
        )
    if report["kv_slots_after"] != 0:
        failures.append(f"{report['kv_slots_after']:.0f} KV slots still held after all sessions ended")
    if report["rss_growth_after_warmup_mb"] > args.max_rss_growth:
        failures.append(
            f"RSS grew {report['rss_growth_after_warmup_mb']:.0f} MB after warm-up > {args.max_rss_growth} MB"
        )
    # A slow leak grows little in ten minutes and a gigabyte in a day: the rate is judged too,
    # once it stands out of the saw-tooth by two standard errors.
    slope, error = report["rss_slope_mb_per_hour"], report["rss_slope_stderr_mb_per_hour"]
    if error is not None and slope - 2 * error > args.max_rss_slope:
        failures.append(
            f"RSS grows {slope:.0f} ± {2 * error:.0f} MB/h after warm-up > {args.max_rss_slope} MB/h"
        )
    if report["utterances"] == 0:
        failures.append("no utterance completed")
    return failures


def run(args: argparse.Namespace) -> int:
    if args.sessions < 1 or args.duration <= 0 or args.speed <= 0:
        print("voxrt soak: --sessions, --duration and --speed must be positive", file=sys.stderr)
        return 2
    try:
        audios = [
            load_audio_file(path, OPENAI_RATE if args.wire == "openai" else SAMPLE_RATE)
            for path in args.audio
        ]
    except UnreadableAudio as exc:
        print(f"voxrt soak: {exc}", file=sys.stderr)
        return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        # Said before the run: after an hour of it, a plot that cannot be drawn loses the hour.
        print("voxrt soak: --plot needs matplotlib: pip install 'voxrt[clients]'", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(soak(args, audios))
    except (OSError, ValueError) as exc:
        print(f"voxrt soak: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 3
    report["failures"] = verdict(report, args)
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary))
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1))
    if args.plot:
        from clients.soak_plot import plot

        plot(report, args.plot)
    for failure in report["failures"]:
        print(f"voxrt soak: FAIL: {failure}", file=sys.stderr)
    return 1 if report["failures"] else 0
