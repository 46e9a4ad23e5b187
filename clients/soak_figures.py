"""The soak's figures from the servers' /metrics: delta latency's quantiles between two scrapes,
the worst half minute (a stall), and the resident set's rate of growth."""

import math
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

MIN_SLOPE_SECONDS = 300.0  # the span after the warm-up a rate of growth is judged over, at least


def scrape(http_bases: list[str]) -> dict[str, float]:
    """Every server's /metrics, summed: replicas behind a balancer are read one by one."""
    values: dict[str, float] = {}
    for http_base in http_bases:
        with urllib.request.urlopen(http_base + "/metrics", timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "voxrt_delta_latency_seconds_bucket":
                    key = f"le={sample.labels['le']}"
                elif not sample.labels:
                    key = sample.name
                else:
                    continue
                values[key] = values.get(key, 0.0) + sample.value
    return values


def histogram_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float | None:
    """Prometheus-style quantile of the delta-latency observations made between two scrapes."""
    buckets = sorted((float(k[3:]), after[k] - before.get(k, 0.0)) for k in after if k.startswith("le="))
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, previous_bound, previous_count = q * buckets[-1][1], 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            share = (rank - previous_count) / max(count - previous_count, 1e-9)
            return previous_bound + (bound - previous_bound) * share
        previous_bound, previous_count = bound, count
    return previous_bound


def worst_window_p95(
    scrapes: list[tuple[float, dict[str, float]]], window: float
) -> tuple[float, float] | None:
    """(p95 delta latency, when it ended) of the worst span of at least `window` seconds
    between two scrapes: a stall of half a minute is what users feel, and a run's p95 over
    an hour hides it."""
    worst, start = None, 0
    for t, after in scrapes:
        while start + 1 < len(scrapes) and t - scrapes[start + 1][0] >= window:
            start += 1
        if t - scrapes[start][0] < window:
            continue
        p95 = histogram_quantile(scrapes[start][1], after, 0.95)
        if p95 is not None and (worst is None or p95 > worst[0]):
            worst = (p95, t)
    return worst


def rss_slope_mb_per_hour(samples: list[dict], warmup_until: float) -> tuple[float, float]:
    """The least-squares line's slope through RSS after the warm-up, and its standard error:
    a server's RSS saw-tooths as windows are allocated and the heap is trimmed, so two
    samples say little, and a short run's slope is told from its noise by the error. Over
    less than `MIN_SLOPE_SECONDS` the error is unbounded: a server still warming (its first
    sessions' buffers, on a busy machine) rises as steeply as a leak."""
    points = [(s["t"], s["rss_mb"]) for s in samples if s["t"] >= warmup_until]
    if len(points) < 4:
        return 0.0, math.inf
    t, rss = np.array(points).T
    (slope, _), cov = np.polyfit(t / 3600, rss, 1, cov=True)
    error = float(np.sqrt(cov[0, 0])) if t[-1] - t[0] >= MIN_SLOPE_SECONDS else math.inf
    return float(slope), error


def rss_growth_mb(samples: list[dict], warmup_until: float) -> float:
    """What that line rose over the run after the warm-up."""
    times = [s["t"] for s in samples if s["t"] >= warmup_until]
    span_hours = (times[-1] - times[0]) / 3600 if times else 0.0
    return rss_slope_mb_per_hour(samples, warmup_until)[0] * span_hours
