"""An upload runs in the same engine as live speech, after it: its positions come after every
live utterance's (tests/test_scheduler.py), and its windows are decoded only in steps that
decode no live window, one at a time, so a live window waits for at most one of them."""

import numpy as np

from benchmarks.real_speech import recording
from benchmarks.text import word_error_rate
from realtime.engine import Engine
from realtime.events import Done
from tests.engine_events import listen

CHUNK = 1600  # 100 ms, as a live client sends


def upload_audio() -> np.ndarray:
    """72 s of two recordings: long enough to be decoded while the live session speaks."""
    return np.concatenate([recording("two_cities").audio, recording("endgame_nagg_nell").audio])


def done_text(events: list) -> str:
    return next(e.text for e in events if isinstance(e, Done))


def transcribed_alone(runner, audio: np.ndarray) -> str:
    engine = Engine(runner)
    events = listen(engine)
    engine.add_utterance("upload", priority=1)
    engine.add_audio("upload", audio)
    engine.finish_input("upload")
    engine.run_once()
    while engine.utterances:
        engine.run_once()
    return done_text(events["upload"])


def test_an_upload_decodes_only_in_steps_live_speech_leaves(whisper_runner, welcome, monkeypatch):
    samples, text = welcome
    upload = upload_audio()
    alone = transcribed_alone(whisper_runner, upload)
    engine = Engine(whisper_runner)
    events = listen(engine)
    steps: list[list[int]] = []  # per step, the priority of each window it decoded
    execute, decode = whisper_runner.execute, whisper_runner._decode

    def recorded_execute(out, states):
        steps.append([])
        return execute(out, states)

    def recorded_decode(windows):
        steps[-1].extend(w.request.priority for w in windows)
        return decode(windows)

    monkeypatch.setattr(whisper_runner, "execute", recorded_execute)
    monkeypatch.setattr(whisper_runner, "_decode", recorded_decode)
    engine.add_utterance("upload", priority=1)
    engine.add_audio("upload", upload)  # all at once, as an upload is handed over
    engine.finish_input("upload")
    engine.add_utterance("live")
    for offset in range(0, len(samples), CHUNK):
        engine.add_audio("live", samples[offset : offset + CHUNK])
        engine.run_once()
    engine.finish_input("live")
    while engine.utterances:
        engine.run_once()

    assert word_error_rate(text, done_text(events["live"])) <= 0.1
    assert done_text(events["upload"]) == alone  # its windows are its own, whenever decoded
    upload_steps = [step for step in steps if 1 in step]
    assert upload_steps and any(0 in step for step in steps)
    assert all(step == [1] for step in upload_steps), [s for s in upload_steps if s != [1]]
