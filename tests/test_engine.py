"""The engine driven step by step: failures, aborts and what a session leaves behind."""

import time

from realtime.engine import Delta, Done, Engine, Failed


def test_abort_mid_stream_frees_everything(whisper_runner, welcome):
    samples, _ = welcome
    engine = Engine(whisper_runner)
    events: list = []
    engine.add_session("s", events.append)
    engine.add_audio("s", samples[: 16000 * 4])
    engine.run_once()
    assert engine.scheduler.encoder_cache.num_used_rows > 0
    items = engine.scheduler.requests["s"].items
    engine.abort("s")
    engine.run_once()
    assert engine.sessions == {} and engine.scheduler.requests == {}
    assert engine.stats().encoder_cache_rows == 0
    assert engine.scheduler.encoder_cache.input_ids_by_request == {}
    assert all(item.features is None for item in items)
    assert not any(isinstance(e, Done) for e in events)


def test_a_failing_step_fails_its_sessions_and_the_engine_goes_on(whisper_runner, welcome, monkeypatch):
    samples, _ = welcome
    engine = Engine(whisper_runner)
    first: list = []
    engine.add_session("a", first.append)
    engine.add_audio("a", samples[: 16000 * 3])
    real_execute = whisper_runner.execute

    def broken(out, streams):
        raise RuntimeError("device on fire")

    monkeypatch.setattr(whisper_runner, "execute", broken)
    engine.start()
    try:
        deadline = time.monotonic() + 30
        while not first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first and isinstance(first[0], Failed) and first[0].code == "processing_error"
        monkeypatch.setattr(whisper_runner, "execute", real_execute)
        second: list = []
        engine.add_session("b", second.append)
        engine.add_audio("b", samples[: 16000 * 3])
        engine.finish_input("b")
        while not any(isinstance(e, Done) for e in second) and time.monotonic() < deadline + 30:
            time.sleep(0.05)
        assert isinstance(second[-1], Done) and "morning" in second[-1].text.lower()
        assert engine.stats().encoder_cache_rows == 0
    finally:
        engine.stop()


def test_deltas_are_append_only_and_add_up(whisper_runner, welcome):
    samples, _ = welcome
    engine = Engine(whisper_runner)
    events: list = []
    engine.add_session("s", events.append)
    for offset in range(0, len(samples), 4000):
        engine.add_audio("s", samples[offset : offset + 4000])
        engine.run_once()
    engine.finish_input("s")
    engine.run_once()
    deltas = [e.text for e in events if isinstance(e, Delta)]
    done = events[-1]
    assert isinstance(done, Done) and "".join(deltas) == done.text and len(deltas) >= 3
    assert done.audio_seconds == len(samples) / 16000  # what the client sent, not the padding
