"""Measured capacity: what a speaking session costs the model per step, how many sessions
that leaves room for, and whether a new one fits.

A family steps each session at least once per `step_period_seconds` (Whisper re-decodes
a window each second at full load; Voxtral Realtime computes a position per 80 ms): a
batch of sessions keeps up while its step fits in that period. Whisper steps back to
back when it has room (the model's busy share of wall time is high at one session), so
the cost is read per step, not from the busy share, which is reported as a figure.

The cost is projected from full windows only (`ModelSpec.full_window_seconds`): a
Whisper session's first windows are short and cheap, and capacity read from them admitted
sessions that fell behind once their windows grew, to be shed mid-sentence. Until a full
window is measured the projection is a prior (timed at load), or what shorter windows cost if that is more
(a slower machine); after, the latest measurement holds through silence.
"""

import math
from collections import deque
from dataclasses import dataclass, field

from realtime.settings import setting


@dataclass(kw_only=True)
class CapacityConfig:
    target_busy: float = field(
        default=0.8,
        metadata=setting(
            "admit sessions while all of them speaking would keep the model at most this busy"
            " (past 1: --max-sessions alone caps them)",
            least=0.01,
        ),
    )
    max_lag_seconds: float = field(
        default=3.0,
        metadata=setting(
            "refuse new sessions once one is this far behind real time, and shed the newest once"
            " one has stayed this far behind for as long again",
            least=0,
        ),
    )
    # The share of each step period the sessions kept after a shed may take: they are already
    # behind, and only a step shorter than its period lets them catch up.
    shed_to_busy: float = 0.7
    window_seconds: float = 10.0  # what "lately" means
    # Model seconds a speaking session adds per step until a full window is measured:
    # `voxrt serve` sets what a dummy full window cost at load (`WhisperRunner.full_window_cost`);
    # else about what tiny.en's (int8) costs on 2 CPU cores, rounded up.
    session_step_prior: float = 0.3


@dataclass
class _Step:
    ended_at: float
    model_seconds: float
    sessions: int  # the sessions the model decoded for in it
    full_windows: int  # of those decodes, the ones of a full window
    lane_seconds: float  # its model time on each lane it used: what its sessions cost together

    @property
    def full_window_model_seconds(self) -> float:
        """The lane seconds its full windows take, each a session's equal share."""
        return self.lane_seconds * self.full_windows / self.sessions if self.full_windows else 0.0


class Capacity:
    def __init__(
        self,
        config: CapacityConfig,
        step_period_seconds: float,
        full_window_seconds: float,
        now: float,
        lanes: int = 1,
    ):
        """`lanes`: shares of a step the runner computes at once, each on its own thread: a step period
        holds that many periods of model time."""
        self.config = config
        self.lanes = lanes
        self.step_period_seconds = step_period_seconds
        self.full_window_seconds = full_window_seconds
        self.steps: deque[_Step] = deque()
        self.started_at = now
        # Sums over `steps`, kept as steps come and go: a fast family steps hundreds of times
        # within the window, and every step reads them.
        self.model_seconds = 0.0
        self.decoded_model_seconds = 0.0  # of the steps that decoded for any session
        self.decodes = 0
        self.full_window_model_seconds = 0.0
        self.full_windows = 0
        self.measured_full = False
        # Model seconds a speaking session adds per step: the full windows' mean over the
        # window, or the latest such mean, or the prior. The whole step is charged to its
        # sessions, fixed costs too.
        self.session_step_seconds = config.session_step_prior

    def record(self, now: float, model_seconds: float, windows: list[float]) -> None:
        """A step done: its model time, and the seconds of audio each of its decodes read."""
        full = sum(1 for seconds in windows if seconds >= self.full_window_seconds)
        lanes_used = max(1, min(self.lanes, len(windows)))
        step = _Step(now, model_seconds, len(windows), full, model_seconds * lanes_used)
        self.steps.append(step)
        self._count(step, 1)
        while self.steps[0].ended_at < now - self.config.window_seconds:
            self._count(self.steps.popleft(), -1)
        if self.full_windows:
            self.measured_full = True
            self.session_step_seconds = self.full_window_model_seconds / self.full_windows
        elif not self.measured_full and self.decodes:
            mean = self.decoded_model_seconds / self.decodes
            self.session_step_seconds = max(self.config.session_step_prior, mean)

    def _count(self, step: _Step, sign: int) -> None:
        self.model_seconds += sign * step.model_seconds
        if step.sessions:
            self.decoded_model_seconds += sign * step.lane_seconds
            self.decodes += sign * step.sessions
        self.full_window_model_seconds += sign * step.full_window_model_seconds
        self.full_windows += sign * step.full_windows

    def busy_share(self, now: float) -> float:
        span = min(self.config.window_seconds, now - self.started_at)
        return self.model_seconds / span if span > 0 else 0.0

    def sessions(self, busy: float) -> int:
        """How many sessions fit, all speaking, with each step at most `busy` of the period."""
        period = busy * self.step_period_seconds * self.lanes
        return max(1, math.floor(period / max(self.session_step_seconds, 1e-6)))
