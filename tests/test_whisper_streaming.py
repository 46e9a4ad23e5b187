"""Streaming Whisper against its own offline transcript and the known text (espeak-ng speech)."""

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor, WhisperTokenizerFast

from benchmarks.real_speech import recording
from benchmarks.reference import transformers_whisper
from benchmarks.streaming_wer import streamed
from benchmarks.text import whisper_wer, word_error_rate
from benchmarks.whisper_streaming import offline_texts
from realtime.engine.events import Delta, Done
from realtime.engine.loop import Engine
from tests.conftest import espeak
from tests.engine_events import listen
from voxtral.runner import Transcription
from voxtral.whisper.runner import WhisperRunner

pytestmark = pytest.mark.untimed

# Each voice reads its own passage, so a session that read another's window would fail.
PASSAGES = [
    "Good morning everyone. Today we will talk about the weather in the city. It was raining all night, "
    "but the sun came out this morning. Many people went to the park to walk their dogs.",
    "The train to the coast leaves at nine in the morning. We packed our bags the night before and went to "
    "bed early. My brother forgot his hat, so we stopped at a small shop near the station.",
    "Our kitchen is the warmest room in the house. Every Sunday my mother bakes bread and the whole street "
    "can smell it. She taught me to mix the flour with water and a little salt.",
    "The library opens at ten and closes at six. You can borrow up to five books for two weeks. If you need "
    "more time, ask at the front desk and they will help you.",
]
# (voice, words per minute, pause between words in 10 ms units)
VOICES = [("en-us", 150, 0), ("en+m3", 165, 0), ("en-us+m7", 150, 2), ("en-us", 130, 4)]


def speak_with_pauses(tmp_path, passage: str, voice: str, rate: int, gap: int) -> np.ndarray:
    """The passage sentence by sentence, with 0.75-1.25 s of silence between sentences."""
    pieces = []
    for i, sentence in enumerate(passage.split(". ")):
        pieces.append(espeak(sentence, tmp_path / f"{voice}-{rate}-{i}.wav", voice, rate, gap))
        pieces.append(np.zeros(12000 + 4000 * (i % 3), np.float32))
    return np.concatenate(pieces)


def stream_through_engine(
    engine: Engine,
    audios: dict[str, np.ndarray],
    seed: int = 0,
    transcriptions: dict[str, Transcription] | None = None,
) -> dict[str, list]:
    """Feed every stream in random 100-500 ms pieces, interleaved, stepping the engine as audio arrives."""
    rng = np.random.default_rng(seed)
    events = listen(engine)
    for name in audios:
        engine.add_utterance(name, transcription=(transcriptions or {}).get(name, Transcription()))
    offsets = dict.fromkeys(audios, 0)
    while any(offsets[n] < len(a) for n, a in audios.items()):
        for name, samples in audios.items():
            if offsets[name] >= len(samples):
                continue
            size = int(rng.integers(1600, 8001))
            engine.add_audio(name, samples[offsets[name] : offsets[name] + size])
            offsets[name] += size
            if offsets[name] >= len(samples):
                engine.finish_input(name)
        engine.run_once()
        # Back to back while a step has work, as the server's loop steps.
        while any(u.request.wants_step for u in engine.utterances.values()):
            engine.run_once()
    for _ in range(len(audios) + 2):
        engine.run_once()
    return events


def offline_text(whisper_dir, runner: WhisperRunner, samples: np.ndarray, **generate: object) -> str:
    extractor = WhisperFeatureExtractor(feature_size=80)
    features = extractor(
        samples,
        sampling_rate=16000,
        return_tensors="pt",
        truncation=False,
        padding="longest",
        return_attention_mask=True,
    )
    tokens = transformers_whisper(runner.model).generate(
        features.input_features, attention_mask=features.attention_mask, return_timestamps=True, **generate
    )
    return WhisperTokenizerFast(tokenizer_file=str(whisper_dir / "tokenizer.json")).decode(
        tokens[0], skip_special_tokens=True
    )


@pytest.fixture
def runner(whisper_model):
    return WhisperRunner(whisper_model)


@pytest.mark.slow
def test_streaming_wer_close_to_offline(runner, whisper_dir, tmp_path):
    texts = {f"{v}-{r}-{g}": passage for (v, r, g), passage in zip(VOICES, PASSAGES, strict=True)}
    audios = {
        f"{voice}-{rate}-{gap}": speak_with_pauses(tmp_path, passage, voice, rate, gap)
        for (voice, rate, gap), passage in zip(VOICES, PASSAGES, strict=True)
    }
    assert all(len(a) > 10 * 16000 for a in audios.values())
    engine = Engine(runner)
    events = stream_through_engine(engine, audios)
    streaming, offline = [], []
    for name, samples in audios.items():
        done = [e for e in events[name] if isinstance(e, Done)]
        deltas = [e.text for e in events[name] if isinstance(e, Delta)]
        assert len(done) == 1, events[name]
        assert "".join(deltas) == done[0].text, "deltas must add up to the final text"
        assert len(deltas) >= 5, "text must stream, not arrive at the end"
        streaming.append(word_error_rate(texts[name], done[0].text))
        offline.append(word_error_rate(texts[name], offline_text(whisper_dir, runner, samples)))
        print(f"{name}: streaming WER {streaming[-1]:.3f}, offline WER {offline[-1]:.3f}")
        assert streaming[-1] <= 0.15, done[0].text
    # Averaged over the voices: one voice's WER moves by ~5 points with where the
    # chunking ends its windows (seeds 0-3 of `stream_through_engine`), offline's does not.
    assert np.mean(streaming) <= np.mean(offline) + 0.03
    stats = engine.stats()
    assert stats.utterances == 0 and stats.encoder_cache_rows == 0


@pytest.mark.slow
def test_silence_and_noise_give_no_text(runner):
    rng = np.random.default_rng(1)
    seconds = 16000 * 12
    audios = {
        "silence": np.zeros(seconds, np.float32),
        "hiss": (rng.standard_normal(seconds) * 0.01).astype(np.float32),
        "noise": (rng.standard_normal(seconds) * 0.1).astype(np.float32),
        "loud-noise": np.clip(rng.standard_normal(seconds) * 0.4, -1, 1).astype(np.float32),
    }
    events = stream_through_engine(Engine(runner), audios)
    for name in audios:
        done = [e for e in events[name] if isinstance(e, Done)]
        assert len(done) == 1 and done[0].text == "", (name, done)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["endgame_nagg_nell", "beckett"])
def test_real_recordings_streamed_are_as_right_as_offline(runner, name):
    """People reading (benchmarks/real_speech.py; 38 s of audio in all), streamed one step per
    0.7 s of audio with no clock, against the same served model's offline transcript. Endgame's
    two voices say things twice and take short turns after pauses: dropping a repeat as a loop,
    or starting a turn's window without what was said before it, put 6 words of its 75 wrong."""
    audio = recording(name).audio
    offline = offline_texts(runner.model, [audio])[0]
    text = streamed(Engine(runner), audio, round(0.7 * 16000)).text
    assert whisper_wer(offline, text) <= 0.03, (offline, text)


def without_pauses(samples: np.ndarray, frame: int = 320, keep: int = 5) -> np.ndarray:
    """The speech with every pause cut to `keep` 20 ms frames: one turn, as the VAD hears it."""
    frames = samples[: len(samples) // frame * frame].reshape(-1, frame)
    quiet = np.sqrt((frames**2).mean(axis=1)) < 0.003
    run = np.zeros(len(quiet), int)
    for i, silent in enumerate(quiet):
        run[i] = run[i - 1] + 1 if silent and i else int(silent)
    return frames[run <= keep].reshape(-1)


def test_a_turn_longer_than_one_decode_handed_over_at_once_is_decoded_whole(whisper_runner):
    """33 s of speech without a pause, in one command (an upload, a client far ahead of real
    time): a decode reads 30 s, so the turn is decoded a window at a time, and none is lost."""
    two_cities = recording("two_cities")
    audio = without_pauses(two_cities.audio)
    assert len(audio) > 31 * 16000
    engine = Engine(whisper_runner)
    events = listen(engine)
    engine.add_utterance("fast")
    engine.add_audio("fast", audio)
    engine.finish_input("fast")
    engine.run_once()
    while engine.utterances:
        engine.run_once()
    turns = [e for e in events["fast"] if type(e).__name__ in ("SpeechStarted", "SpeechStopped")]
    assert len(turns) == 2  # one turn
    (done,) = [e for e in events["fast"] if isinstance(e, Done)]
    assert word_error_rate(two_cities.reference, done.text) <= 0.05, done.text
