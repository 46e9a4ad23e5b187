"""The engine driven step by step: failures, aborts and what a session leaves behind."""

import gc
import time
import weakref

import pytest

from benchmarks.text import word_error_rate
from realtime.engine.events import Delta, Done, Failed
from realtime.engine.loop import Engine
from tests.conftest import wait_for
from tests.engine_events import listen


def test_abort_mid_stream_frees_everything(whisper_runner, welcome):
    samples, _ = welcome
    engine = Engine(whisper_runner)
    events = listen(engine)["s"]
    engine.add_utterance("s")
    engine.add_audio("s", samples[: 16000 * 4])
    engine.run_once()
    assert engine.scheduler.encoder_cache.num_used_rows > 0
    request = weakref.ref(engine.scheduler.requests["s"])
    engine.abort("s")
    engine.run_once()
    assert engine.utterances == {} and engine.scheduler.requests == {}
    assert engine.stats().encoder_cache_rows == 0
    assert engine.scheduler.encoder_cache.input_ids_by_request == {}
    gc.collect()
    assert request() is None, "the ended utterance's timeline (items, features) is still held"
    assert not any(isinstance(e, Done) for e in events)


def test_a_failing_step_fails_its_sessions_and_the_engine_goes_on(whisper_runner, welcome, monkeypatch):
    samples, _ = welcome
    engine = Engine(whisper_runner)
    events = listen(engine)
    first = events["a"]
    engine.add_utterance("a")
    engine.add_audio("a", samples[: 16000 * 3])
    real_execute = whisper_runner.execute

    def broken(out, streams):
        raise RuntimeError("device on fire")

    monkeypatch.setattr(whisper_runner, "execute", broken)
    engine.start()
    try:
        deadline = time.monotonic() + 30
        while not any(isinstance(e, Failed) for e in first) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert isinstance(first[-1], Failed) and first[-1].code == "processing_error"
        monkeypatch.setattr(whisper_runner, "execute", real_execute)
        second = events["b"]
        engine.add_utterance("b")
        engine.add_audio("b", samples[: 16000 * 3])
        engine.finish_input("b")
        while not any(isinstance(e, Done) for e in second) and time.monotonic() < deadline + 30:
            time.sleep(0.05)
        assert isinstance(second[-1], Done) and "morning" in second[-1].text.lower()
        assert engine.stats().encoder_cache_rows == 0
    finally:
        engine.stop()


def test_deltas_are_append_only_and_add_up(whisper_runner, welcome):
    samples, text = welcome
    engine = Engine(whisper_runner)
    events = listen(engine)["s"]
    engine.add_utterance("s")
    for offset in range(0, len(samples), 4000):
        engine.add_audio("s", samples[offset : offset + 4000])
        engine.run_once()
    engine.finish_input("s")
    engine.run_once()
    deltas = [e.text for e in events if isinstance(e, Delta)]
    done = events[-1]
    assert isinstance(done, Done) and "".join(deltas) == done.text and len(deltas) >= 3
    # The content itself, against the text that was spoken, not against the engine's own deltas.
    assert word_error_rate(text, done.text) <= 0.15, done.text
    assert done.audio_seconds == len(samples) / 16000  # what the client sent, not the padding


def test_utterances_done_in_one_step_end_in_the_order_they_were_added(whisper_runner, welcome):
    samples, _ = welcome
    engine = Engine(whisper_runner)
    added, done = ["c", "a", "d", "b"], []
    engine.on_events = lambda batch: done.extend(u for u, e in batch if isinstance(e, Done))
    for utterance_id in added:
        engine.add_utterance(utterance_id)
        engine.add_audio(utterance_id, samples[: 16000 * 2])
    engine.run_once()  # the scheduler's turn moves on: the next step schedules "a" first
    for utterance_id in added:
        engine.add_audio(utterance_id, samples[16000 * 2 : 16000 * 3])
        engine.finish_input(utterance_id)
    engine.run_once()
    assert done == added


def test_a_listener_that_raises_never_stops_the_engine(whisper_runner, welcome):
    """It loses the events it raised on; the engine and the events after them go on."""
    samples, text = welcome
    engine = Engine(whisper_runner)
    raised: list = []
    good: list = []

    def listener(batch: list) -> None:
        good.extend(e for u, e in batch if u == "good")
        if broken := [e for u, e in batch if u == "broken"]:
            raised.extend(broken)
            raise RuntimeError("listener bug")

    engine.on_events = listener
    engine.start()
    try:
        for utterance_id, ended in (("broken", raised), ("good", good)):
            engine.add_utterance(utterance_id)
            engine.add_audio(utterance_id, samples[: 16000 * 6])
            engine.finish_input(utterance_id)
            wait_for(lambda ended=ended: ended and isinstance(ended[-1], Done | Failed))
        assert isinstance(good[-1], Done) and word_error_rate(text, good[-1].text) < 0.6
        assert any(isinstance(e, Done) for e in raised), "the broken listener kept getting its events"
        assert engine.alive and engine.stats().utterances == 0
    finally:
        engine.stop()


@pytest.mark.parametrize("lag", [0.0, 2.5])
def test_delta_latency_counts_from_the_arrival_of_the_audio(whisper_runner, welcome, lag):
    """An engine that falls `lag` seconds behind reports `lag` more, not the time since its last step."""
    samples, _ = welcome
    engine = Engine(whisper_runner)
    events = listen(engine)["s"]
    engine.add_utterance("s")
    engine.add_audio("s", samples[: 16000 * 6])
    engine.finish_input("s")
    time.sleep(lag)  # the audio has arrived; the engine has not looked at it yet
    while not events or not isinstance(events[-1], Done):
        engine.run_once()
    latencies = [e.latency for e in events if isinstance(e, Delta)]
    assert latencies and min(latencies) >= lag
    assert max(latencies) < lag + 20
