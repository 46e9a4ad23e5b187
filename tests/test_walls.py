"""Walls between utterances: a fault in one utterance's command, rows or output fails it alone,
frees all it held, and every other utterance carries on to the text it would have had."""

import pytest

from realtime.engine.events import Done, Failed
from realtime.engine.loop import Engine
from tests.conftest import wait_for
from tests.engine_events import listen
from tests.test_voxtral_engine import assert_nothing_held, noise
from tests.voxtral_harness import Feed, drive, pieces, reference_text, reference_tokens, voxtral_engine
from voxtral.vad import VadConfig


def faulty(fail_when):
    """A stand-in that raises where `fail_when(*args)` holds, and otherwise calls the real one."""

    def wrap(real):
        def call(*args, **kwargs):
            if fail_when(*args):
                raise RuntimeError("injected fault")
            return real(*args, **kwargs)

        return call

    return wrap


def _decode_of_slot_1(engine):
    model = engine.runner.model
    return model, "decode", lambda rows, audio: 1 in rows.slots.tolist() and rows.positions.max() > 20


def _encode_of_slot_1(engine):
    model = engine.runner.model
    return model, "encode", lambda frames, mels: 1 in frames.slots.tolist() and frames.positions.max() > 40


def _start_of_bad(engine):
    return engine.runner, "new_state", lambda request, transcription: request.request_id == "bad"


def _last_text_of_bad(engine):
    """Its last output, where the output path makes its text from the ids it sampled."""
    return engine.utterances, "deliver", lambda utterance, out: utterance.id == "bad" and out.finished


@pytest.mark.parametrize("fault", [_decode_of_slot_1, _encode_of_slot_1, _start_of_bad, _last_text_of_bad])
def test_a_fault_of_one_utterance_fails_it_alone(voxtral_dirs, monkeypatch, fault):
    """`good` and `bad` (KV slots 0 and 1) stream together; the fault is `bad`'s alone: in its
    rows of a batched forward, its start, its output's text."""
    path = voxtral_dirs["base"]
    engine = voxtral_engine(path, max_sessions=3)
    owner, name, fail_when = fault(engine)
    monkeypatch.setattr(owner, name, faulty(fail_when)(getattr(owner, name)))
    audio = {"good": noise(2.0, seed=11), "bad": noise(2.0, seed=12)}
    feeds = {name: Feed(pieces(audio[name], "80ms")) for name in ("good", "bad")}
    drive(engine, feeds)
    good, bad = feeds["good"], feeds["bad"]
    assert isinstance(bad.events[-1], Failed) and bad.events[-1].code == "processing_error", bad.events
    assert isinstance(good.events[-1], Done), good.events
    assert good.events[-1].text == reference_text(path, reference_tokens(path, audio["good"]))
    assert engine.healthy
    assert_nothing_held(engine)


def test_a_fault_no_row_reproduces_fails_the_step_and_marks_the_engine_unhealthy(voxtral_dirs, monkeypatch):
    path = voxtral_dirs["base"]
    engine = voxtral_engine(path, max_sessions=3)
    model = engine.runner.model
    monkeypatch.setattr(model, "decode", faulty(lambda rows, audio: len(rows.lengths) > 1)(model.decode))
    events = listen(engine)
    engine.start()
    try:
        for name, seed in (("a", 4), ("b", 5)):
            engine.add_utterance(name)
            engine.add_audio(name, noise(3.0, seed=seed))
        wait_for(lambda: events["a"] and events["b"] and all(isinstance(events[n][-1], Failed) for n in "ab"))
        assert not engine.healthy
        after = noise(1.5, seed=6)
        engine.add_utterance("after")  # alone: the engine still serves what it is given
        engine.add_audio("after", after)
        engine.finish_input("after")
        wait_for(lambda: events["after"] and isinstance(events["after"][-1], Done | Failed))
    finally:
        engine.stop()
    assert events["after"][-1].text == reference_text(path, reference_tokens(path, after))
    assert_nothing_held(engine)


def run_whisper_good_and_bad(engine, samples, bad_vad=None) -> dict:
    """`good` and `bad` speak the same 3 s together; when both have ended, their events."""
    events = listen(engine)
    engine.add_utterance("good")
    engine.add_utterance("bad", vad=bad_vad)
    for name in ("good", "bad"):
        engine.add_audio(name, samples[: 16000 * 3])
        engine.finish_input(name)
    engine.start()
    try:
        wait_for(lambda: all(events[n] and isinstance(events[n][-1], Done | Failed) for n in ("good", "bad")))
    finally:
        engine.stop()
    assert isinstance(events["bad"][-1], Failed) and events["bad"][-1].code == "processing_error"
    assert isinstance(events["good"][-1], Done) and "morning" in events["good"][-1].text.lower()
    assert engine.healthy and engine.stats().encoder_cache_rows == 0 and engine.utterances == {}
    return events


def test_a_whisper_window_that_fails_alone_fails_its_utterance_alone(whisper_runner, welcome, monkeypatch):
    engine = Engine(whisper_runner)
    encode = faulty(lambda window: window.request.request_id == "bad")
    monkeypatch.setattr(whisper_runner.decoder, "_encode", encode(whisper_runner.decoder._encode))
    run_whisper_good_and_bad(engine, welcome[0])


def test_a_vad_fault_fails_the_utterance_whose_audio_raised_it(whisper_runner, welcome, monkeypatch):
    engine = Engine(whisper_runner)
    odd = VadConfig(threshold=0.77)
    probabilities = faulty(lambda streams: any(s.config == odd for s in streams))
    monkeypatch.setattr(engine.vad, "probabilities", probabilities(engine.vad.probabilities))
    run_whisper_good_and_bad(engine, welcome[0], bad_vad=odd)
