"""`Capacity` keeps running sums over its window of steps: they must read what summing the
window's steps reads."""

import numpy as np
import pytest

from realtime.capacity import Capacity, CapacityConfig


def test_capacity_sums_read_what_the_steps_in_its_window_sum_to():
    config = CapacityConfig(window_seconds=2.0, session_step_prior=0.25)
    capacity = Capacity(config, step_period_seconds=1.0, now=0.0)
    rng = np.random.default_rng(0)
    recorded: list[tuple[float, float, int]] = []
    now = 0.0
    # Busy stretches, and idle ones longer than the window (no step worked for a session: the prior).
    for sessions_at_most in [4, 0, 3, 0, 1] * 3:
        for _ in range(400):
            now += float(rng.uniform(0, 0.02))
            step = (now, float(rng.uniform(0, 0.01)), int(rng.integers(0, sessions_at_most + 1)))
            capacity.record(*step)
            recorded.append(step)
            window = [s for s in recorded if s[0] >= now - config.window_seconds]
            worked = [s for s in window if s[2]]
            expected = sum(s[1] for s in worked) / sum(s[2] for s in worked) if worked else 0.25
            assert capacity.session_step_seconds == pytest.approx(expected, abs=1e-9)
            span = min(config.window_seconds, now)
            assert capacity.busy_share(now) == pytest.approx(sum(s[1] for s in window) / span, abs=1e-9)
