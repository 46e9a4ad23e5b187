"""Measured capacity: what one session costs the model per step lately, how many sessions
that leaves room for, and whether a new one fits.

A family steps each session at least once per `step_period_seconds` (Whisper re-decodes
a window each second at full load; Voxtral Realtime computes a position per 80 ms): a
batch of sessions keeps up while its step fits in that period. Whisper steps back to
back when it has room (the model's busy share of wall time is high at one session), so
the cost is read per step, not from the busy share, which is reported as a figure.
"""

import math
from collections import deque
from dataclasses import dataclass, field

from realtime.settings import setting


@dataclass(kw_only=True)
class CapacityConfig:
    target_busy: float = field(
        default=0.8,
        metadata=setting("admit sessions while all of them speaking would keep the model at most this busy"),
    )
    max_lag_seconds: float = field(
        default=3.0,
        metadata=setting("refuse new sessions, and shed the newest, once one is this far behind real time"),
    )
    # The share of each step period the sessions kept after a shed may take: they are already
    # behind, and only a step shorter than its period lets them catch up.
    shed_to_busy: float = 0.7
    window_seconds: float = 10.0  # what "lately" means
    # Model seconds per session per step before any step was measured: tiny.en (int8
    # decoder) on 2 CPU cores with continuous speech (no pause lets the VAD skip a step):
    # 0.27-0.43 s measured on slow days. A faster box or model is measured within a step.
    session_step_prior: float = 0.3


@dataclass
class _Step:
    ended_at: float
    model_seconds: float
    sessions: int  # the sessions the model worked for in it


class Capacity:
    def __init__(self, config: CapacityConfig, step_period_seconds: float, now: float) -> None:
        self.config = config
        self.step_period_seconds = step_period_seconds
        self.steps: deque[_Step] = deque()
        self.started_at = now
        # Sums over `steps`, kept as steps come and go: a fast family steps hundreds of times
        # within the window, and every step reads them.
        self.model_seconds = 0.0
        self.worked_model_seconds = 0.0  # of the steps that worked for any session
        self.worked_sessions = 0

    def record(self, now: float, model_seconds: float, sessions: int) -> None:
        step = _Step(now, model_seconds, sessions)
        self.steps.append(step)
        self._count(step, 1)
        while self.steps[0].ended_at < now - self.config.window_seconds:
            self._count(self.steps.popleft(), -1)

    def _count(self, step: _Step, sign: int) -> None:
        self.model_seconds += sign * step.model_seconds
        if step.sessions:
            self.worked_model_seconds += sign * step.model_seconds
            self.worked_sessions += sign * step.sessions

    def busy_share(self, now: float) -> float:
        span = min(self.config.window_seconds, now - self.started_at)
        return self.model_seconds / span if span > 0 else 0.0

    @property
    def session_step_seconds(self) -> float:
        """Model seconds per session per step, over the window's steps that decoded any. The
        whole step is charged to its sessions, fixed costs too: an estimate erring low."""
        if not self.worked_sessions:
            return self.config.session_step_prior
        return self.worked_model_seconds / self.worked_sessions

    def sessions(self, busy: float) -> int:
        """How many sessions fit, all speaking, with each step at most `busy` of the period."""
        return max(1, math.floor(busy * self.step_period_seconds / max(self.session_step_seconds, 1e-6)))
