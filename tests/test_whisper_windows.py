"""A Whisper window moves on only past speech it transcribed: flite speech on which tiny.en
once lost whole clauses (the benchmark's voices, `benchmarks/speech.py`)."""

import numpy as np
import pytest

from benchmarks.speech import passage, synthesize
from benchmarks.text import normalize_words
from realtime.engine.events import Done
from realtime.engine.loop import Engine
from tests.test_turns import stream_stepped
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.runner import WhisperRunner

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
