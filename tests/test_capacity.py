"""Admission by measured capacity and shedding, against a real default `voxrt serve` (tiny.en as
it loads on this CPU) on this machine, with real-time speech, each session's audio its own."""

import asyncio
import contextlib
import json
import math
import time

import numpy as np
import pytest
from websockets.exceptions import InvalidStatus

from benchmarks.capacity import KEPT_UP_SECONDS, sessions_audio
from benchmarks.client_process import Arrival, Refused
from clients.audio import distinct_audio
from clients.connection import StreamedUtterance, open_connection, stream_utterance
from realtime.config import ServerConfig
from realtime.engine.capacity import CapacityConfig
from realtime.engine.config import EngineConfig
from tests.server_harness import ServerProcess, ServerThread, hold_steps, http_get, metric
from voxtral.whisper.runner import WhisperRunner

pytestmark = pytest.mark.slow
SESSION_SECONDS = 3.0
MAX_TRIES = 100
MAX_LAG_SECONDS = 8.0


@contextlib.contextmanager
def serve(*flags: str):
    server = ServerProcess(*flags)
    try:
        yield server.port
    finally:
        server.stop()


def test_twelve_arrivals_half_a_second_apart_are_seated_or_told_to_retry_and_none_is_shed():
    """12 sessions of real speech, each its own, arrive 0.5 s apart. Those that do not fit
    are refused at the door with a 503 and `Retry-After`, and retry until seated; none is
    seated and then shed; none seated falls behind real time."""
    audios = sessions_audio(12, SESSION_SECONDS)
    with serve() as port:
        url = f"ws://127.0.0.1:{port}/v1/realtime"

        async def arrive(index: int) -> Arrival:
            await asyncio.sleep(0.5 * index)
            refusals = []
            while len(refusals) < MAX_TRIES:  # each after what Retry-After asks, not doubled
                try:
                    connection = await open_connection(url)
                except InvalidStatus as exc:
                    refusals.append(Refused.of(exc))
                    await asyncio.sleep(float(exc.response.headers["Retry-After"]))
                    continue
                async with connection:
                    return Arrival(await stream_utterance(connection, audios[index], 100, 1.0), refusals)
            return Arrival(refusals[-1], refusals)

        async def all_arrivals() -> list[Arrival]:
            return list(await asyncio.gather(*(arrive(i) for i in range(12))))

        arrivals = asyncio.run(all_arrivals())
        sheds = metric(port, "voxrt_sheds_total")
    first_try = sum(1 for a in arrivals if not a.refusals)
    print(f"admitted at the first try: {first_try} of 12")
    assert sheds == 0
    # Behind real time as the server itself draws the line (it refuses newcomers past it). The
    # benchmark's tighter `KEPT_UP_SECONDS` is a figure to print: on a slow CPU the finals of
    # sessions ending together share one step and come up to about a second late.
    lags = []
    for arrival, audio in zip(arrivals, audios, strict=True):
        result = arrival.result
        assert isinstance(result, StreamedUtterance), result  # seated within its tries
        assert result.done is not None and not result.errors, result.errors
        lags.append(result.done_at - len(audio) / 16000)
        for refusal in arrival.refusals:
            assert (refusal.status, refusal.code) == (503, "server_busy") and int(refusal.retry_after) > 0
    assert first_try >= 1
    kept_up = sum(lag <= KEPT_UP_SECONDS for lag in lags)
    print(f"final text {min(lags):.2f}-{max(lags):.2f} s after the audio; {kept_up} in {KEPT_UP_SECONDS} s")
    assert max(lags) <= CapacityConfig().max_lag_seconds


def test_when_everyone_speaks_at_once_the_newest_are_shed(welcome):
    samples, _ = welcome
    silence = np.zeros(16000 * 2, np.float32)
    max_lag = 1.5
    # Overcommitted on purpose (as an operator may): sessions admitted while silent, then all
    # speaking at once for 12 s, each its own audio, on one thread. A session waits for the
    # windows of all the others before its own, so there are enough of them for a round of
    # their windows to take twice the lag bound on this machine, by what the server timed a
    # window at here (and never fewer than the 12 that overloaded the slower machines this
    # test was first written on). The target admits them all, so admission never refuses the last.
    flags = ("--target-busy", "100", "--max-lag-seconds", str(max_lag), "--threads", "1")
    with serve(*flags, "--max-sessions", "500") as port:
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        window = json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])["session_step_seconds"]
        count = max(12, math.ceil(2 * max_lag / window))

        async def session(i: int, opened: list):
            connection = await open_connection(url)
            opened.append(i)
            audio = np.concatenate([silence, distinct_audio(samples, i)])
            async with connection:
                result = await stream_utterance(connection, audio, 100, 1.0)
                if result.errors:  # shed: the close frame follows the error
                    await connection.wait_closed()
                return i, result, connection.close_code

        async def scenario():
            opened = []
            tasks = []
            for i in range(count):
                tasks.append(asyncio.create_task(session(i, opened)))
                # Opened in this order: the last is the newest. A session refused at the door ends
                # its task, and gathering it fails the test with the refusal.
                while len(opened) <= i and not tasks[i].done():
                    await asyncio.sleep(0.01)
            return await asyncio.gather(*tasks), opened

        results, opened = asyncio.run(scenario())
        sheds_counted = metric(port, "voxrt_sheds_total")
    overloaded = [{"code": "server_overloaded", "closed": 1013}]
    shed = [
        opened.index(i)
        for i, r, closed in results
        if [{"code": e["code"], "closed": closed} for e in r.errors] == overloaded
    ]
    kept = [opened.index(i) for i, r, _ in results if r.done is not None and not r.errors]
    print(f"shed (by opening order) {sorted(shed)}; kept {sorted(kept)}")
    assert sorted(shed + kept) == list(range(count)), [(r.errors, closed) for _, r, closed in results]
    assert shed and kept and sheds_counted == len(shed)
    # The newest first: every shed session opened after every kept one.
    assert min(shed) > max(kept)


def test_a_session_alone_is_never_shed(welcome):
    """Shedding is for the sessions it keeps: one alone, however far behind it falls (here
    past a `--max-lag-seconds` of a millisecond), catches up or not on its own."""
    with serve("--max-lag-seconds", "0.001") as port:

        async def alone():
            async with await open_connection(f"ws://127.0.0.1:{port}/v1/realtime") as connection:
                return await stream_utterance(connection, welcome[0][: 5 * 16000], 100, 1.0)

        result = asyncio.run(alone())
        lags, observed = metric(port, "voxrt_lag_seconds_sum"), metric(port, "voxrt_lag_seconds_count")
        sheds = metric(port, "voxrt_sheds_total")
    assert result.done is not None and not result.errors, result.errors
    assert lags > 0.001 * observed > 0  # some check found it past --max-lag-seconds
    assert sheds == 0


def test_sessions_behind_after_a_stall_they_recover_from_are_not_shed(whisper_model, welcome, monkeypatch):
    """The engine held mid-speech, as a server that lost its cores is (a neighbour's burst, a
    paused process), until the watcher finds a session past `--max-lag-seconds`: both catch up
    once it runs again, and neither is shed. Shedding here would keep one, so the newer would
    go. The catch-up (each session's grown window decoded, one after the other) has the bound's
    seconds, set well above what it takes, so that a slow machine still fits."""
    samples, _ = welcome
    capacity = CapacityConfig(target_busy=100, max_lag_seconds=MAX_LAG_SECONDS, shed_to_busy=1e-9)
    engine_config = EngineConfig(max_sessions=8, capacity=capacity)
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(), engine_config)
    gate, _ = hold_steps(harness.engine, monkeypatch)
    gate.set()

    async def session(i: int) -> StreamedUtterance:
        async with await open_connection(harness.url) as connection:
            return await stream_utterance(connection, distinct_audio(samples, i), 100, 1.0)

    async def scenario() -> list[StreamedUtterance]:
        sessions = [asyncio.create_task(session(i)) for i in range(2)]
        # Both mid-speech: the engine has consumed audio of each (a session that ended
        # first fails the test with how it ended).
        while len([h for h in list(harness.server.handles.by_id.values()) if h.consumed_samples > 0]) < 2:
            ended = [task for task in sessions if task.done()]
            assert not ended, [task.result() for task in ended]
            await asyncio.sleep(0.05)
        gate.clear()
        deadline = time.monotonic() + 60
        while harness.server.admission.lag_seconds <= MAX_LAG_SECONDS:  # the watcher's finding
            assert time.monotonic() < deadline, "no session fell behind while the engine was held"
            await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(*sessions)

    try:
        results = asyncio.run(scenario())
        metrics = harness.metrics()
    finally:
        gate.set()
        harness.stop()
    lags = {name: value for name, value in metrics.items() if name.startswith("voxrt_lag_seconds")}
    assert metrics["voxrt_sheds_total"] == 0, lags
    for result in results:
        assert result.done is not None and not result.errors, result.errors
