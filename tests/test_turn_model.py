"""A semantic end of turn (`voxtral/turn_model.py`, `VadConfig.complete_at`): the turn model
reads what transformers' Whisper features give it, and in the engine a reader's pause in the
middle of a sentence does not end the turn where silence alone does, while a pause after a
sentence ends it without waiting out the longest pause."""

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor

from benchmarks.real_speech import recording
from realtime.engine.events import Done, SpeechStopped
from realtime.engine.loop import Engine
from tests.engine_events import listen
from voxtral.audio import SAMPLE_RATE
from voxtral.turn_model import CLIP_SAMPLES, turn_features
from voxtral.vad import VadConfig
from voxtral.whisper.runner import WhisperRunner

pytestmark = pytest.mark.untimed
SEMANTIC = VadConfig(silence_ms=300, complete_at=0.5, max_silence_ms=4000)
SILENCE = VadConfig(silence_ms=500)
# two_cities, seconds: "It was the age of" | "wisdom," and
# "it was the worst of times." | "It was the age of wisdom,"
MID_SENTENCE = ((5.0, 5.86), (5.86, 6.45))
SENTENCE_END = ((2.9, 4.6), (5.0, 6.4))
PAUSE_SECONDS = 1.2


@pytest.fixture(scope="module")
def reader() -> np.ndarray:
    return recording("two_cities").audio


def quiet(seconds: float, seed: int) -> np.ndarray:
    """A room's silence: noise 60 dB down."""
    return np.random.default_rng(seed).normal(0, 1e-3, int(seconds * SAMPLE_RATE)).astype(np.float32)


def spoken(reader: np.ndarray, parts: tuple) -> tuple[np.ndarray, float]:
    """The two parts with a pause between them and silence after; where the pause begins (s)."""
    first, second = (reader[int(a * SAMPLE_RATE) : int(b * SAMPLE_RATE)] for a, b in parts)
    audio = np.concatenate([first, quiet(PAUSE_SECONDS, 1), second, quiet(2.5, 2)])
    return audio, len(first) / SAMPLE_RATE


@pytest.mark.parametrize("length", [CLIP_SAMPLES, 3 * SAMPLE_RATE])
def test_the_turn_models_features_are_transformers_whisper_features_of_8_s(reader, length):
    clip = reader[SAMPLE_RATE : SAMPLE_RATE + length]
    padded = np.concatenate([np.zeros(CLIP_SAMPLES - length, np.float32), clip])
    extractor = WhisperFeatureExtractor(chunk_length=8)
    expected = extractor(padded, sampling_rate=SAMPLE_RATE, do_normalize=True, return_tensors="np")
    assert np.abs(turn_features(clip) - expected.input_features[0]).max() < 1e-4


def turn_ends(
    runner: WhisperRunner, audio: np.ndarray, vad: VadConfig, sessions: int = 1
) -> tuple[list[float], int]:
    """Where the engine's VAD ended each turn of `audio` fed 100 ms a step to each of
    `sessions` utterances at once (seconds, the first's); and the turn model's calls."""
    engine = Engine(runner)
    events = listen(engine)
    for session in range(sessions):
        engine.add_utterance(f"u{session}", vad)
    for offset in range(0, len(audio), SAMPLE_RATE // 10):
        for session in range(sessions):
            engine.add_audio(f"u{session}", audio[offset : offset + SAMPLE_RATE // 10])
        engine.run_once()
    for session in range(sessions):
        engine.finish_input(f"u{session}")
    while not all(any(isinstance(e, Done) for e in events[f"u{s}"]) for s in range(sessions)):
        engine.run_once()
    ends = [[e.audio_ms / 1000 for e in said if isinstance(e, SpeechStopped)] for said in events.values()]
    assert len(ends) == sessions and all(other == ends[0] for other in ends)
    return ends[0], engine.stats().turn_model_calls


def test_a_pause_mid_sentence_is_not_a_turn_end_where_silence_alone_makes_it_one(whisper_model, reader):
    runner = WhisperRunner(whisper_model)
    audio, pause = spoken(reader, MID_SENTENCE)
    silence, calls = turn_ends(runner, audio, SILENCE)
    assert len(silence) == 2 and silence[0] == pytest.approx(pause, abs=0.3) and calls == 0
    semantic, calls = turn_ends(runner, audio, SEMANTIC)
    assert len(semantic) == 1 and semantic[0] > pause + PAUSE_SECONDS and calls >= 1
    # Three sessions pausing together are judged together: no more calls than one alone.
    assert turn_ends(runner, audio, SEMANTIC, sessions=3) == (semantic, calls)


def test_a_pause_after_a_sentence_ends_the_turn_at_once(whisper_model, reader):
    runner = WhisperRunner(whisper_model)
    audio, pause = spoken(reader, SENTENCE_END)
    assert turn_ends(runner, audio, SEMANTIC)[0][0] == pytest.approx(pause, abs=0.3)
