"""A Whisper window moves on only past speech it transcribed: flite speech on which tiny.en
once lost whole clauses (the benchmark's voices, `benchmarks/speech.py`)."""

from dataclasses import replace

import numpy as np
import pytest

from benchmarks.conversation_set import phone_call
from benchmarks.real_speech import PAUSE_SECONDS, recording
from benchmarks.speech import passage, synthesize
from benchmarks.text import normalize_words
from clients.audio import distinct_audio
from realtime.engine.events import Done
from realtime.engine.loop import Engine
from tests.test_turns import stream_stepped
from voxtral.audio import SAMPLE_RATE
from voxtral.vad import VadConfig
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.runner import WhisperRunner, served_policy

pytestmark = pytest.mark.untimed


def streamed_words(runner: WhisperRunner, audio: np.ndarray) -> str:
    """The final text of `audio` sent in 100 ms chunks, one engine step after each, normalized."""
    done = [e for _, e in stream_stepped(Engine(runner), audio, 1600) if isinstance(e, Done)]
    assert len(done) == 1
    return " ".join(normalize_words(done[0].text))


@pytest.mark.slow
def test_a_timestamp_past_the_window_audio_does_not_trim_away_the_next_sentence(whisper_model, tmp_path):
    """tiny.en closed the first sentence's segment at 7.0 s of a 3.7 s window (in the silence
    padded after it); the window, trimmed there once it grew long, skipped the next
    sentence's first nine words. Nothing is committed before a turn ends here, so only
    the trim decides what stays in the window."""
    sentences = [
        "I have a short question about the bus timetable.",
        "When the summer holidays begin, the buses will run every twenty minutes instead of every ten, "
        "and the last bus will leave the market square at eleven in the evening.",
    ]
    gap = np.zeros(9600, np.float32)
    audio = np.concatenate(
        [np.zeros(4800, np.float32)]
        + [piece for s in sentences for piece in (synthesize("flite", "rms", 0, s, tmp_path), gap)]
    )
    runner = WhisperRunner(whisper_model, WhisperPolicy(min_commit_seconds=100.0))
    words = streamed_words(runner, audio)
    assert "when the summer holidays begin the buses will run" in words, words


@pytest.mark.slow
def test_a_decoder_that_stops_before_the_audio_does_not_lose_what_follows(whisper_model):
    """On this audio tiny.en ended its text after "and that", seconds before the window's
    audio ended, and every later decode, forced the same words, stopped there again: the
    turn's last sentence and the next were lost."""
    audio = passage(whisper_model, 4).audio[30 * 16000 : 52 * 16000]
    words = streamed_words(WhisperRunner(whisper_model), audio)
    assert words.endswith("better lights let us start with the budget"), words


@pytest.mark.slow
def test_a_new_turn_not_yet_heard_keeps_the_turn_before_in_its_window(whisper_model):
    """The first 16 s of the served benchmark's first session (`benchmarks/real_speech.py`: its
    pause before the recording, its faint noise), in 0.1 s steps. After "the age of
    foolishness." and a pause, the first decode of the next turn had not heard its first words
    yet, and text ending a second before the audio read as a stalled decoder: the window was
    trimmed past the turn before it, and the new turn, decoded without that context, came out
    "It was the epoch of the leaf"."""
    pause = np.zeros(int(np.random.default_rng(0).uniform(*PAUSE_SECONDS) * SAMPLE_RATE), np.float32)
    audio = np.concatenate([pause, recording("two_cities").audio])[: 16 * SAMPLE_RATE]
    words = streamed_words(WhisperRunner(whisper_model), distinct_audio(audio, 0))
    assert "it was the epoch of belief" in words, words


def decoded_windows(runner: WhisperRunner, audio: np.ndarray, vad: VadConfig, step: int) -> list[float]:
    """The seconds of every window `runner` decoded for `audio`, sent `step` samples a step."""
    windows: list[float] = []
    execute = runner.execute

    def recorded(out, states):
        result = execute(out, states)
        windows.extend(o.window_seconds for outs in result.outputs.values() for o in outs if o.num_tokens)
        return result

    runner.execute = recorded
    engine = Engine(runner)
    engine.add_utterance("u", vad=vad)
    for offset in range(0, len(audio), step):
        engine.add_audio("u", audio[offset : offset + step])
        engine.run_once()
    engine.finish_input("u")
    for _ in range(10):
        engine.run_once()
    return windows


def test_a_call_turned_at_short_pauses_keeps_its_windows_short(whisper_model):
    """The real call, its turns ended at 300 ms pauses (Deepgram's shortest endpointing) and
    decoded every 1.2 s (a loaded server's cadence): tiny.en writes some of its long turns as
    one open segment, which cannot leave the window; its committed words leave instead, so no
    window grows far past `word_trim_after_seconds` and no decode costs more and more."""
    audio, vad, step = phone_call().audio, VadConfig(silence_ms=300), round(1.2 * SAMPLE_RATE)
    policy = served_policy(whisper_model)
    grown = decoded_windows(
        WhisperRunner(whisper_model, replace(policy, word_trim_after_seconds=99)), audio, vad, step
    )
    assert max(grown) > policy.word_trim_after_seconds + 3  # the call makes such windows
    bounded = decoded_windows(WhisperRunner(whisper_model, policy), audio, vad, step)
    assert max(bounded) <= policy.word_trim_after_seconds + 1.2 + 0.5, max(bounded)
