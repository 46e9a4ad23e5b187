"""Turn detection and realtime commits: Silero VAD batched in the step loop, endpointing,
words committed inside long sentences, and opt-in interim text."""

import json
import time
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from silero_vad import load_silero_vad

from benchmarks.text import normalize_words, word_error_rate
from realtime.config import ServerConfig
from realtime.engine.events import AudioConsumed, Delta, Done, Interim, SpeechStarted, SpeechStopped
from realtime.engine.loop import Engine
from tests.conftest import espeak
from tests.engine_events import listen
from tests.server_harness import ServerThread, append_event
from voxtral.vad import FRAME, Vad, VadStream
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.runner import WhisperRunner

LONG_SENTENCE = (
    "The first thing we need to decide is whether the new library should open in the spring "
    "or wait until the building inspection is finished in the autumn"
)


def voiced(audio: np.ndarray) -> tuple[float, float]:
    """Where speech starts and ends in a synthesized clip, in seconds."""
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return loud[0] / 16000, loud[-1] / 16000


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16000), np.float32)


def stream_stepped(
    engine: Engine, audio: np.ndarray, chunk: int, finish: bool = True
) -> list[tuple[float, object]]:
    """Feed `audio` in chunks, one engine step after each; every event with the audio seconds sent by then."""
    events: list = []
    sent = [0.0]
    engine.on_events = lambda batch: events.extend(
        (sent[0], e) for _, e in batch if not isinstance(e, AudioConsumed)
    )
    engine.add_utterance("u")
    for offset in range(0, len(audio), chunk):
        engine.add_audio("u", audio[offset : offset + chunk])
        sent[0] = min(len(audio), offset + chunk) / 16000
        engine.run_once()
    if finish:
        engine.finish_input("u")
        for _ in range(10):
            engine.run_once()
    return events


def test_batched_vad_equals_the_packaged_model_run_on_each_stream_alone(tmp_path):
    rng = np.random.default_rng(0)
    speech = espeak("Good morning everyone, and welcome to the meeting.", tmp_path / "a.wav")
    audios = [
        np.concatenate([silence(0.7), speech, silence(0.5)]),
        (rng.standard_normal(40000) * 0.05).astype(np.float32),
        np.concatenate([speech[8000:], silence(1.0)]),
    ]
    vad, streams = Vad(), [VadStream() for _ in audios]
    got: list[list[float]] = [[] for _ in audios]
    offsets = [0, 0, 0]
    sizes = [1600, 2500, 777]  # uneven chunks: streams hold different numbers of frames each call
    while any(o < len(a) for o, a in zip(offsets, audios, strict=True)):
        for i, audio in enumerate(audios):
            streams[i].feed(audio[offsets[i] : offsets[i] + sizes[i]])
            offsets[i] += sizes[i]
        for i, probs in enumerate(vad.probabilities(streams)):
            got[i] += probs.tolist()
    reference = load_silero_vad()
    for audio, probs in zip(audios, got, strict=True):
        reference.reset_states()
        frames = [audio[k : k + FRAME] for k in range(0, len(audio) - FRAME + 1, FRAME)]
        expected = [float(reference(torch.from_numpy(f), 16000)) for f in frames]
        assert len(probs) == len(expected)
        # TorchScript re-optimizes a graph after its first runs: last digits may differ.
        np.testing.assert_allclose(probs, expected, atol=1e-3)
    assert max(got[0]) > 0.9  # the speech was heard: the comparison is not between two zero arrays


def test_vad_is_one_batched_call_per_step_for_all_utterances(whisper_runner, tmp_path):
    speech = espeak("Please bring your notes and arrive on time.", tmp_path / "a.wav")
    engine = Engine(whisper_runner)
    for name in "abcd":
        engine.add_utterance(name)
    steps = 0
    for offset in range(0, len(speech), 8000):
        for name in "abcd":
            engine.add_audio(name, speech[offset : offset + 8000])
        engine.run_once()
        steps += 1
    assert steps >= 4 and engine.vad.calls == steps  # not four per step
    assert engine.stats().vad_calls == steps


def one_window_a_step(whisper_model) -> WhisperRunner:
    """One lane with room for one window a step: which window gets it is the order's to say."""
    return WhisperRunner(whisper_model, WhisperPolicy(max_windows_per_step=1))


def test_a_step_decodes_one_window_of_a_turn_going_on_and_the_others_wait_counted_behind(
    whisper_model, tmp_path
):
    speech = espeak(LONG_SENTENCE, tmp_path / "long.wav", rate=140)
    engine = Engine(one_window_a_step(whisper_model))
    events = listen(engine, consumed=True)
    names = "abc"
    for name in names:
        engine.add_utterance(name)
    engine.run_once()
    rounds, waited = 0, 0
    for offset in range(0, 16000 * 6, 9600):  # 0.6 s a round, inside the sentence: all due again
        for name in names:
            engine.add_audio(name, speech[offset : offset + 9600])
        decoded: list[str] = []
        for _ in names:  # the steps after the first get no new audio: what waits is decoded
            now = decoded_by_one_step(engine, names)
            assert len(now) <= 1, now
            decoded += now
            computed = {n: engine.utterances[n].request.num_computed * 160 for n in names}
            behind = {n: computed[n] - consumed(events[n]) for n in names}
            # Only audio whose decode is due and waits counts: the one just decoded has none.
            assert all(behind[n] == 0 for n in now) and all(b <= 16000 for b in behind.values()), behind
            waited = max(waited, *behind.values())
        if decoded:
            rounds += 1
            assert sorted(decoded) == list(names), decoded  # each in turn, all within the round
    assert rounds >= 5 and waited > 0


def feed(engine: Engine, name: str, audio: np.ndarray, arrived_from: float) -> None:
    """`audio` in 0.1 s items, as a real-time client's: the item ending `t` s into it arrived
    at `arrived_from + t`."""
    for offset in range(0, len(audio), 1600):
        engine.add_audio(name, audio[offset : offset + 1600], arrived_from + (offset + 1600) / 16000)


def consumed(events: list) -> int:
    """The audio the engine last said it consumed of an utterance."""
    return next((e.samples for e in reversed(events) if isinstance(e, AudioConsumed)), 0)


def decoded_by_one_step(engine: Engine, names: Sequence[str]) -> list[str]:
    before = {n: engine.utterances[n].state.decoded_until for n in names}
    engine.run_once()
    return [n for n in names if engine.utterances[n].state.decoded_until != before[n]]


def decoded_for_a_while(engine: Engine, name: str, audio: np.ndarray) -> None:
    engine.add_utterance(name)
    engine.add_audio(name, audio)
    engine.run_once()
    while engine.utterances[name].request.wants_step:
        engine.run_once()
    assert engine.utterances[name].state.decoded_until * 160 > len(audio) - 8000


def test_the_window_due_longest_goes_first_whenever_its_session_began(whisper_model, tmp_path):
    """Positions count from each session's start: a session that began earlier has the later
    due positions, and its window, due for longer, still goes first."""
    speech = espeak(LONG_SENTENCE, tmp_path / "long.wav", rate=140)
    engine = Engine(one_window_a_step(whisper_model))
    decoded_for_a_while(engine, "older", speech[: 16000 * 3])
    engine.add_utterance("newer")
    engine.run_once()
    now = time.monotonic()
    feed(engine, "older", speech[16000 * 3 : 16000 * 5], now)  # due 0.5 s after its last decode
    feed(engine, "newer", speech[: int(16000 * 1.2)], now + 0.8)  # due once 0.5 s of it is speech
    assert decoded_by_one_step(engine, ("older", "newer")) == ["older"]


def test_a_client_faster_than_real_time_waits_behind_windows_due_before_it(whisper_model, tmp_path):
    """A client sending faster than real time has audio due as soon as its last decode began:
    the real-time session whose window fell due earlier goes first, however much audio the
    fast one holds."""
    speech = espeak(LONG_SENTENCE, tmp_path / "long.wav", rate=140)
    engine = Engine(one_window_a_step(whisper_model))
    decoded_for_a_while(engine, "fast", speech[: 16000 * 4])
    engine.add_utterance("steady")
    engine.run_once()
    now = time.monotonic()
    engine.add_audio("fast", speech[16000 * 4 :], now)  # the rest of the sentence at once
    feed(engine, "steady", speech[: int(16000 * 1.2)], now - 1.2)  # the last 1.2 s, in real time
    assert decoded_by_one_step(engine, ("fast", "steady")) == ["steady"]


def test_speech_events_fire_in_order_at_the_speech_bounds(whisper_runner, tmp_path):
    first = espeak("It was raining all night.", tmp_path / "a.wav")
    second = espeak("But the sun came out this morning.", tmp_path / "b.wav")
    parts = [silence(1.0), first, silence(1.5), second, silence(1.0)]
    audio = np.concatenate(parts)
    starts = np.cumsum([0] + [len(p) for p in parts])[:-1] / 16000
    bounds = [starts[1] + b for b in voiced(first)] + [starts[3] + b for b in voiced(second)]
    events = stream_stepped(Engine(whisper_runner), audio, 1600)
    turns = [e for _, e in events if isinstance(e, SpeechStarted | SpeechStopped)]
    assert [type(t) for t in turns] == [SpeechStarted, SpeechStopped] * 2, turns
    for turn, expected in zip(turns, bounds, strict=True):
        assert abs(turn.audio_ms / 1000 - expected) < 0.3, (turns, bounds)
    done = events[-1][1]
    assert (
        isinstance(done, Done)
        and word_error_rate("It was raining all night. But the sun came out this morning.", done.text) <= 0.15
    )


def test_turns_that_arrive_faster_than_real_time_are_each_committed_whole(whisper_runner, welcome):
    """A client uploading a file: the VAD hears every turn before the first step decodes one.
    Each turn is decoded on its own window (the old single turn end let one window span
    them all, and the encoder's 30 s cut off every turn after the first)."""
    speech = welcome[0][: 4 * 16000]  # "Good morning everyone. Today we will talk about ..."
    audio = np.concatenate([speech, silence(20.0)] * 4)
    engine = Engine(whisper_runner)
    events = listen(engine)["u"]
    engine.add_utterance("u")
    engine.add_audio("u", audio)
    engine.finish_input("u")
    while not any(isinstance(e, Done) for e in events):
        engine.run_once()
    assert len([e for e in events if isinstance(e, SpeechStopped)]) == 4
    assert engine.num_steps == 1  # all four turns came to one step
    text = events[-1].text.lower()
    assert text.count("good morning") == 4 and text.count("today we will") == 4, text


def test_silence_and_noise_give_no_speech_events_and_no_text(whisper_runner):
    rng = np.random.default_rng(1)
    for audio in (silence(6), (rng.standard_normal(96000) * 0.02).astype(np.float32)):
        events = [e for _, e in stream_stepped(Engine(whisper_runner), audio, 4000)]
        assert not [e for e in events if not isinstance(e, Done)], events
        assert events[-1].text == ""


def test_a_long_sentence_gets_words_committed_while_it_is_spoken(whisper_runner, tmp_path):
    speech = espeak(LONG_SENTENCE, tmp_path / "long.wav", rate=140)
    start, end = voiced(speech)
    assert end - start >= 8.0
    events = stream_stepped(Engine(whisper_runner), speech, 4000)  # 250 ms chunks
    deltas = [(sent, e.text) for sent, e in events if isinstance(e, Delta)]
    words_by = [
        (sent, len(normalize_words("".join(t for _, t in deltas[: i + 1]))))
        for i, (sent, _) in enumerate(deltas)
    ]
    # The first words arrive within the first half of the sentence, most of it before its end.
    assert deltas and deltas[0][0] <= start + (end - start) / 2, deltas
    assert max(n for sent, n in words_by if sent <= end) >= len(LONG_SENTENCE.split()) // 2, deltas
    assert word_error_rate(LONG_SENTENCE, events[-1][1].text) <= 0.15


def test_endpointing_commits_the_whole_utterance_within_a_second_of_its_end(whisper_runner, tmp_path):
    speech = espeak("Many people went to the park to walk their dogs.", tmp_path / "a.wav")
    _, end = voiced(speech)
    events = stream_stepped(
        Engine(whisper_runner), np.concatenate([speech, silence(3.0)]), 1600, finish=False
    )
    committed = ""
    for sent, event in events:
        if isinstance(event, Delta):
            committed += event.text
            if sent <= end + 1.0 and normalize_words(committed)[-1:] == ["dogs"]:
                break
    else:
        pytest.fail(f"not committed whole within 1 s of its end: {committed!r}, {events}")
    assert word_error_rate("Many people went to the park to walk their dogs.", committed) <= 0.15
    assert not any(isinstance(e, Done) for _, e in events)  # a turn ended, not the utterance


def test_a_turn_shows_interim_text_before_any_of_it_may_be_committed(whisper_runner, tmp_path):
    """A turn is decoded for interim text from half a second of speech on; its words are
    committed from a second on (a hypothesis of less speech is unreliable, and a committed
    word is forced on every later decode)."""
    policy = whisper_runner.policy
    assert policy.min_decode_seconds < policy.min_commit_seconds
    speech = espeak("Many people went to the park to walk their dogs.", tmp_path / "a.wav")
    start = 1.0 + voiced(speech)[0]
    audio = np.concatenate([silence(1.0), speech, silence(1.0)])
    events = stream_stepped(Engine(whisper_runner), audio, 800, finish=False)  # 50 ms chunks
    interim = next(sent for sent, e in events if isinstance(e, Interim) and e.text)
    delta = next(sent for sent, e in events if isinstance(e, Delta))
    # A turn is first decoded within an item (0.1 s) of the least speech decoded.
    assert interim < start + policy.min_decode_seconds + policy.chunk_seconds + 0.1, events
    assert delta > start + policy.min_commit_seconds - 0.1, events


def test_interim_text_is_opt_in_and_never_changes_committed_text(whisper_runner, tmp_path):
    speech = espeak(LONG_SENTENCE, tmp_path / "long.wav", rate=140)
    server = ServerThread(whisper_runner, ServerConfig(), max_sessions=2)
    try:
        received = {}
        for opt_in in (False, True):
            with server.connect() as connection:
                if opt_in:
                    connection.send(json.dumps({"type": "session.update", "interim": True}))
                for offset in range(0, len(speech), 4000):  # 250 ms chunks at twice real time
                    connection.send(append_event(speech[offset : offset + 4000]))
                    time.sleep(0.125)
                connection.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
                events = []
                while not events or events[-1]["type"] != "transcription.done":
                    events.append(json.loads(connection.recv(timeout=60)))
                received[opt_in] = events
    finally:
        server.stop()
    for opt_in, events in received.items():
        interims = [e["text"] for e in events if e["type"] == "transcription.interim"]
        assert bool(interims) == opt_in, events
        deltas = [e["delta"] for e in events if e["type"] == "transcription.delta"]
        assert "".join(deltas) == events[-1]["text"]
        assert word_error_rate(LONG_SENTENCE, events[-1]["text"]) <= 0.15
    # Interim text ran ahead of the committed text more than once.
    assert sum(1 for e in received[True] if e["type"] == "transcription.interim" and e["text"]) >= 2
