"""The scheduler's `Request` has one writer: a family runner hands back what it decided in its
step output, and the scheduler applies it (`Scheduler.update_from_output`); audio enters, and
sampled ids come back, through scheduler methods too."""

import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.streaming_wer import streamed
from realtime.engine.config import EngineConfig
from realtime.engine.loop import Engine
from scheduler import Request
from voxtral.loading import load_model
from voxtral.whisper.runner import WhisperRunner

pytestmark = pytest.mark.untimed


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

    def record(updates, sampled):
        moved.extend(u.retain_from for u in updates.values())
        return update_from_output(updates, sampled)

    monkeypatch.setattr(engine.scheduler, "update_from_output", record)
    # After 4 s of silence the window leaves the first sentences behind.
    audio = np.concatenate([welcome[0], np.zeros(4 * 16000, np.float32), welcome[0][: 3 * 16000]])
    done = streamed(engine, audio, 8000)
    assert writes == []
    assert "weather" in done.text.lower()
    assert moved == sorted(moved) and moved[-1] > 0  # the window moved on, through the scheduler
    assert engine.stats().encoder_cache_rows == 0


def request_writers(monkeypatch) -> set[str]:
    """The files whose code wrote a `Request` field (past the request's own methods and its
    construction), relative to the repository."""
    writers: set[str] = set()
    setattr_, own = Request.__setattr__, Path(sys.modules[Request.__module__].__file__).resolve()
    root = own.parent.parent

    def guarded_setattr(self, name, value):
        frame = sys._getframe(1)
        while Path(frame.f_code.co_filename).resolve() == own:  # the request's own methods
            frame = frame.f_back
        if frame.f_code.co_name != "__init__":  # its construction sets every field once
            writers.add(str(Path(frame.f_code.co_filename).resolve().relative_to(root)))
        setattr_(self, name, value)

    monkeypatch.setattr(Request, "__setattr__", guarded_setattr)
    return writers


@pytest.mark.parametrize("family", ["whisper", "voxtral"])
def test_only_the_scheduler_writes_a_request(whisper_model, voxtral_dirs, welcome, monkeypatch, family):
    if family == "whisper":
        engine = Engine(WhisperRunner(whisper_model))
    else:
        runner = load_model(str(voxtral_dirs["base"]), "cpu", max_sessions=1).runner
        engine = Engine(runner, EngineConfig(max_sessions=1))
    writers = request_writers(monkeypatch)
    done = streamed(engine, welcome[0][: 16000 * 3], 3200)
    assert done.text and writers == {"scheduler/scheduler.py"}, writers


@pytest.mark.parametrize("spec", ["base"])
def test_voxtral_placeholders_come_from_the_scheduler(voxtral_dirs, welcome, monkeypatch, spec):
    engine = Engine(
        load_model(str(voxtral_dirs[spec]), "cpu", max_sessions=1).runner, EngineConfig(max_sessions=1)
    )
    writes = guard_requests(engine, monkeypatch)
    done = streamed(engine, welcome[0][: 16000 * 2], 3200)
    assert writes == []
    assert done.num_tokens > 0
