"""`Capacity` keeps running sums over its window of steps: they must read what summing the
window's steps reads, and the projection must come from full windows only."""

import subprocess
import sys

import numpy as np
import pytest

from realtime.engine.capacity import Capacity, CapacityConfig
from tests.conftest import ROOT

FULL = 12.0  # seconds of a full window


def test_capacity_sums_read_what_the_steps_in_its_window_sum_to():
    config = CapacityConfig(window_seconds=2.0, session_step_prior=0.25)
    capacity = Capacity(config, step_period_seconds=1.0, full_window_seconds=FULL, now=0.0)
    rng = np.random.default_rng(0)
    recorded: list[tuple[float, float, list[float]]] = []
    now, latest, measured_full = 0.0, 0.25, False
    # Busy stretches, and idle ones longer than the window (no full window in it: the latest
    # measurement holds; before the first, the prior or the mean decode if that is more).
    for sessions_at_most in [0, 1, 0, 4, 0, 3, 0, 1] * 3:
        for _ in range(400):
            now += float(rng.uniform(0, 0.02))
            longest = FULL + 8 if measured_full or sessions_at_most != 1 else FULL - 1
            windows = [float(rng.uniform(0, longest)) for _ in range(rng.integers(0, sessions_at_most + 1))]
            step = (now, float(rng.uniform(0, 0.6)), windows)
            capacity.record(*step)
            recorded.append(step)
            window = [s for s in recorded if s[0] >= now - config.window_seconds]
            charged = [(s[1] / len(s[2]), sum(w >= FULL for w in s[2])) for s in window if s[2]]
            if full := sum(n for _, n in charged):
                latest, measured_full = sum(share * n for share, n in charged) / full, True
            elif not measured_full and (decodes := sum(len(s[2]) for s in window)):
                latest = max(0.25, sum(s[1] for s in window if s[2]) / decodes)
            assert capacity.session_step_seconds == pytest.approx(latest, abs=1e-9)
            span = min(config.window_seconds, now)
            assert capacity.busy_share(now) == pytest.approx(sum(s[1] for s in window) / span, abs=1e-9)


def test_short_windows_leave_the_prior_and_full_ones_set_the_projection():
    """A session's first windows are short and cheap: capacity read from them admitted
    sessions that fell behind once their windows grew."""
    capacity = Capacity(CapacityConfig(session_step_prior=0.3), 1.0, FULL, now=0.0)
    assert capacity.sessions(0.8) == 2
    for i in range(20):  # four sessions' first seconds: 0.05 s a window
        capacity.record(0.1 * i, 0.2, [1.0, 2.0, 3.0, 4.0])
    assert capacity.session_step_seconds == 0.3 and capacity.sessions(0.8) == 2
    capacity.record(2.1, 0.4, [FULL, 3.0])  # 0.2 s a window, charged equally
    assert capacity.session_step_seconds == pytest.approx(0.2) and capacity.sessions(0.8) == 4
    capacity.record(60.0, 0.0, [])  # a minute of silence: the measurement holds
    assert capacity.session_step_seconds == pytest.approx(0.2)


def test_short_windows_costing_more_than_the_prior_raise_the_projection():
    """On a machine slower than the prior assumes, short windows already say so."""
    capacity = Capacity(CapacityConfig(session_step_prior=0.3), 1.0, FULL, now=0.0)
    capacity.record(0.5, 0.9, [2.0, 3.0])
    assert capacity.session_step_seconds == pytest.approx(0.45) and capacity.sessions(0.8) == 1


def test_serve_admits_by_a_full_window_timed_at_load_until_one_is_measured():
    from realtime.cli import build_server, serve_parser

    server = build_server(serve_parser().parse_args(["--port", "0"]))
    prior = server.engine.config.capacity.session_step_prior
    assert prior != CapacityConfig().session_step_prior and 0 < prior < 5
    assert server.engine.capacity.session_step_seconds == prior


def test_the_vad_leaves_torch_the_threads_it_was_given():
    """Importing silero_vad sets torch's threads to 1 for the process: `voxrt serve` ran its
    model on one core of two."""
    code = (
        "import torch; torch.set_num_threads(2); import realtime.engine.loop; print(torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "2"
