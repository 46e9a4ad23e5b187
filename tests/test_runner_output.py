"""The scheduler's `Request` has one writer: a family runner hands back what it decided in its
step output, and the scheduler applies it (`Scheduler.update_from_output`)."""

import numpy as np
import pytest

from benchmarks.streaming_wer import streamed
from realtime.config import EngineConfig
from realtime.engine import Engine
from scheduler import Request
from voxtral.loading import load_model
from voxtral.whisper.runner import WhisperRunner


def guard_requests(engine: Engine, monkeypatch) -> list[str]:
    """Every write to a `Request` made inside the runner's `submit`, by field name."""
    writes: list[str] = []
    inside = [False]
    setattr_, submit = Request.__setattr__, engine.runner.submit

    def guarded_setattr(self, name, value):
        if inside[0]:
            writes.append(name)
        setattr_(self, name, value)

    def guarded_submit(out, states):
        inside[0] = True
        try:
            return submit(out, states)
        finally:
            inside[0] = False

    monkeypatch.setattr(Request, "__setattr__", guarded_setattr)
    monkeypatch.setattr(engine.runner, "submit", guarded_submit)
    return writes


def test_whisper_steers_its_window_through_its_output_only(whisper_model, welcome, monkeypatch):
    engine = Engine(WhisperRunner(whisper_model))
    writes = guard_requests(engine, monkeypatch)
    moved: list[int] = []  # where each step's output put the window's start
    update_from_output = engine.scheduler.update_from_output

    def record(updates):
        moved.extend(u.retain_from for u in updates.values())
        update_from_output(updates)

    monkeypatch.setattr(engine.scheduler, "update_from_output", record)
    # After 4 s of silence the window leaves the first sentences behind.
    audio = np.concatenate([welcome[0], np.zeros(4 * 16000, np.float32), welcome[0][: 3 * 16000]])
    done = streamed(engine, audio, 8000)
    assert writes == []
    assert "weather" in done.text.lower()
    assert moved == sorted(moved) and moved[-1] > 0  # the window moved on, through the scheduler
    assert engine.stats().encoder_cache_rows == 0


@pytest.mark.parametrize("spec", ["base"])
def test_voxtral_placeholders_come_from_the_scheduler(voxtral_dirs, welcome, monkeypatch, spec):
    engine = Engine(
        load_model(str(voxtral_dirs[spec]), "cpu", max_sessions=1).runner, EngineConfig(max_sessions=1)
    )
    writes = guard_requests(engine, monkeypatch)
    done = streamed(engine, welcome[0][: 16000 * 2], 3200)
    assert writes == []
    assert done.num_tokens > 0
