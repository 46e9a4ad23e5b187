"""Who gets a seat: a new connection while the measured capacity has room and no session
is behind real time; when one stays behind anyway, the newest connection is shed."""

import asyncio
import time

import structlog

from realtime.connection import Connection
from realtime.engine.loop import Engine
from realtime.metrics import Metrics

log = structlog.get_logger("voxrt.admission")

CHECK_SECONDS = 0.5
SHED_MESSAGE = "the server fell behind real time; the newest sessions are shed first: retry later"


class Admission:
    def __init__(self, engine: Engine, metrics: Metrics, connections: set[Connection]):
        self.engine, self.metrics, self.connections = engine, metrics, connections
        self.max_lag_seconds = engine.config.capacity.max_lag_seconds
        # Upgrades admitted and not yet accepted: they hold a seat already.
        self.admitting: set[object] = set()
        self.lag_seconds = 0.0  # the furthest a session was behind real time at the last check
        # The first check of the run of checks past the bound, or the last shed within it.
        self.behind_since: float | None = None

    def seats(self) -> tuple[int, int]:
        """(sessions held or being admitted, sessions that fit now). A connection holds a seat
        for each utterance it has in the engine (OpenAI's committed turns still decoding), and
        one while it has none."""
        fit = min(self.engine.config.max_sessions, self.engine.stats().capacity_sessions)
        held = sum(max(1, len(c.seats)) for c in self.connections)
        return held + len(self.admitting), fit

    def busy(self) -> str | None:
        """Why one more session would not fit, or None."""
        (held, fit), stats = self.seats(), self.engine.stats()
        if held >= fit:
            return f"{held} sessions take the capacity of {fit} ({stats.busy_share:.0%} busy lately)"
        if self.lag_seconds > self.max_lag_seconds:
            return f"sessions are {self.lag_seconds:.1f} s behind real time"
        return None

    def admit(self, upgrade: object) -> str | None:
        """Seat the upgrade, or say why not."""
        if (reason := self.busy()) is None:
            self.admitting.add(upgrade)
        return reason

    def seated(self, upgrade: object) -> None:
        self.admitting.discard(upgrade)

    async def watch(self) -> None:
        """Measure every session's lag. Once one has been behind by more than `max_lag_seconds`
        for as long again, shed the newest connections down to what the model serves with
        room to catch up (at least one), then wait as long again for the effect to show.

        A server that lost the cores for a while (a neighbour's burst on a shared node, a
        pause of the process) is behind at once, and a Whisper session catches up in one
        decode of its grown window: the sessions it would shed then are lost for a stall they
        had already recovered from."""
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                await self._check()
            except Exception:  # the next check goes on: a watcher that died would shed no more
                log.exception("admission.check_failed")

    async def _check(self) -> None:
        now, stats = time.monotonic(), self.engine.stats()
        lags = [c.seats.lag_seconds(now) for c in self.connections]
        for lag in lags:
            self.metrics.lag_seconds.observe(lag)
        self.lag_seconds = max(lags, default=0.0)
        if self.lag_seconds <= self.max_lag_seconds:
            self.behind_since = None
            return
        if self.behind_since is None:
            self.behind_since = now
        if now - self.behind_since < self.max_lag_seconds:
            return
        running = sorted(
            (c for c in self.connections if c.seats and c.closing is None),
            key=lambda c: c.started_at,
        )
        newest = running[max(1, stats.shed_to_sessions) :]
        if not newest:  # the oldest always stays: shedding every session serves no one
            return
        log.warning("admission.shed", connections=len(newest), lag_seconds=round(self.lag_seconds, 3))
        self.behind_since = now  # shed again only if they stay behind as long again
        self.metrics.sheds.inc(len(newest))
        # 1013: try again later.
        closes = [c.close(1013, "server_overloaded", SHED_MESSAGE) for c in newest]
        for failure in await asyncio.gather(*closes, return_exceptions=True):
            if isinstance(failure, Exception):
                log.error("admission.shed_close_failed", exc_info=failure)
