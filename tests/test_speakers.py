"""Speaker labels: the encoder against resemblyzer's own code, the online clustering on real
voices taking turns, its state over a long session, and both wires, which label only when asked."""

import asyncio
import itertools
import json
import time
from collections import Counter

import numpy as np
import pytest
import soxr
import torch
from openai.types.realtime import ConversationItemInputAudioTranscriptionSegment

from benchmarks.conversations import conversation, real_voices, synthetic_voices, word_accuracy
from benchmarks.real_speech import recording
from benchmarks.streaming_wer import streamed
from realtime.config import ServerConfig
from realtime.engine.loop import Engine
from realtime.protocols.openai import DIARIZE_MODEL
from tests.server_harness import ServerThread, append_event, events_until
from tests.test_openai_realtime import b64, client, events_until_completed
from voxtral.audio import SAMPLE_RATE
from voxtral.runner import Transcription
from voxtral.speaker_encoder import CLIP_FRAMES, CLIP_SAMPLES, SpeakerEncoder
from voxtral.speakers import (
    KEEP_SAMPLES,
    MAX_SPEAKERS,
    NEW_SPEAKER_SAMPLES,
    PAUSE_FRAMES,
    SpeakerStream,
)
from voxtral.vad import FRAME, Vad, VadStream
from voxtral.whisper.runner import WhisperRunner


@pytest.fixture(scope="module")
def encoder() -> SpeakerEncoder:
    return SpeakerEncoder()


@pytest.mark.untimed  # no clock: an engine or the encoder stepped by hand
def test_batched_embeddings_equal_resemblyzers_own_one_clip_at_a_time(encoder):
    """Clips of different lengths in one batch, each read to its own end, against resemblyzer's
    mel spectrogram and network run on that clip alone."""
    from resemblyzer import VoiceEncoder
    from resemblyzer.audio import wav_to_mel_spectrogram

    reference = VoiceEncoder("cpu", verbose=False)
    audio = recording("two_cities").audio
    clips = [audio[start : start + length] for start, length in ((0, 25600), (40000, 8000), (90000, 17000))]
    for clip, ours in zip(clips, encoder.embed(clips), strict=True):
        mel = wav_to_mel_spectrogram(clip)[:CLIP_FRAMES]
        with torch.no_grad():
            theirs = reference(torch.from_numpy(mel[None]))[0].numpy()
        np.testing.assert_allclose(ours, theirs, atol=2e-5)


def voices_labels(talk, stream: SpeakerStream) -> dict[int, Counter]:
    """Per true voice, the seconds of its speech under each label, over the segments held."""
    heard: dict[int, Counter] = {}
    for s in stream.segments:
        if s.speaker is not None:
            voice = talk.speaker_at((s.start + s.length(stream.heard) / 2) / SAMPLE_RATE)
            heard.setdefault(voice, Counter())[s.speaker] += s.length(stream.heard) / SAMPLE_RATE
    return heard


@pytest.mark.untimed  # no clock: an engine or the encoder stepped by hand
def test_a_long_session_holds_bounded_state_and_keeps_its_labels(encoder):
    """Twelve minutes of two real voices taking turns: what a stream holds stays within its
    bounds at every step, and each voice has the label it got in the first minute."""
    voices = real_voices()
    talk = conversation("long", voices, 2, 100, seed=7)
    vad, stream, vad_stream = Vad(), SpeakerStream(), VadStream()
    step = SAMPLE_RATE // 2
    early, held_segments = None, []
    for offset in range(0, len(talk.audio), step):
        samples = talk.audio[offset : offset + step]
        stream.feed(samples)
        vad_stream.feed(samples)
        clips = stream.hear(vad.probabilities([vad_stream])[0])
        for (segment, _), embedding in zip(clips, encoder.embed([clip for _, clip in clips]), strict=True):
            stream.embedded(segment, embedding)
        assert len(stream.audio) <= CLIP_SAMPLES + (PAUSE_FRAMES + 1) * FRAME + step
        assert all(s.start >= stream.heard - KEEP_SAMPLES - 20 * SAMPLE_RATE for s in stream.segments)
        assert len(stream.centroids) <= MAX_SPEAKERS
        assert sum(s.length(stream.heard) for s in stream.unsure[:-1]) < NEW_SPEAKER_SAMPLES
        held_segments.append(len(stream.segments))
        if early is None and offset / SAMPLE_RATE > 60:
            early = {
                voice: labels.most_common(1)[0][0] for voice, labels in voices_labels(talk, stream).items()
            }
    assert talk.turns[-1].end > 600 and max(held_segments) < 200
    late = voices_labels(talk, stream)
    assert len(early) == 2 and len(set(early.values())) == 2, early
    for voice, labels in late.items():
        assert labels[early[voice]] >= 0.9 * labels.total(), (voice, early, late)


def speakers_of(whisper_model, talk) -> tuple[float, set[str]]:
    done = streamed(Engine(WhisperRunner(whisper_model)), talk.audio, 1600, Transcription(speakers=True))
    return word_accuracy(talk, done.words), {w.speaker for w in done.words}


@pytest.mark.untimed  # no clock: an engine or the encoder stepped by hand
def test_two_real_voices_get_two_labels_and_their_words_the_right_one(whisper_model):
    accuracy, labels = speakers_of(whisper_model, conversation("real", real_voices(), 2, 8, seed=0))
    assert labels == {"S1", "S2"} and accuracy >= 0.9, (labels, accuracy)


@pytest.mark.untimed  # no clock: an engine or the encoder stepped by hand
def test_three_synthetic_voices_get_their_words_right(whisper_model, tmp_path):
    """Words under a label no voice maps to (one voice split in two) count as wrong."""
    talk = conversation("synthetic", synthetic_voices(tmp_path), 3, 8, 0)
    accuracy, labels = speakers_of(whisper_model, talk)
    assert len(labels) >= 3 and accuracy >= 0.9, (labels, accuracy)


@pytest.fixture(scope="module")
def server(whisper_model):
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(api_key="sk-test"), max_sessions=4)
    yield harness
    harness.stop()


@pytest.fixture(scope="module")
def talk(tmp_path_factory):
    return conversation("wire", synthetic_voices(tmp_path_factory.mktemp("voices")), 2, 4, seed=3)


def test_vllm_wire_labels_words_only_for_a_session_that_asked(server, talk):
    headers = {"Authorization": "Bearer sk-test"}
    with (
        server.connect(additional_headers=headers) as labelled,
        server.connect(additional_headers=headers) as plain,
    ):
        labelled.send(json.dumps({"type": "session.update", "diarize": True}))
        for connection in (labelled, plain):
            connection.send(json.dumps({"type": "input_audio_buffer.commit"}))
        for offset in range(0, len(talk.audio), 3200):  # at 4x real time
            for connection in (labelled, plain):
                connection.send(append_event(talk.audio[offset : offset + 3200]))
            time.sleep(0.05)
        for connection in (labelled, plain):
            connection.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        events = events_until(labelled, "transcription.done")
        untouched = events_until(plain, "transcription.done")
    words = [w for e in events if e["type"] == "transcription.delta" for w in e["words"]]
    assert events[-1]["words"] == words and {w["speaker"] for w in words} == {"S1", "S2"}
    first = [w["speaker"] for w in words if w["end"] < talk.turns[0].end]
    assert first and set(first) == {"S1"}
    # A client that did not ask gets today's events, field for field.
    assert all(set(e) == {"type", "delta"} for e in untouched if e["type"] == "transcription.delta")
    assert set(untouched[-1]) == {"type", "text", "usage"}


def test_openai_wire_sends_a_segment_per_speakers_run_for_the_diarize_model(server, talk):
    audio = soxr.resample(talk.audio, SAMPLE_RATE, 24000)

    async def run(model: str) -> list:
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            session = {
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": model},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 2000},
                    }
                },
            }
            await connection.session.update(session=session)
            for offset in range(0, len(audio), 4800):
                await connection.input_audio_buffer.append(audio=b64(audio[offset : offset + 4800]))
                await asyncio.sleep(0.05)
            await connection.input_audio_buffer.commit()
            return await events_until_completed(connection, 1)

    events = asyncio.run(run(DIARIZE_MODEL))
    segments = [e for e in events if e.type == "conversation.item.input_audio_transcription.segment"]
    assert all(isinstance(s, ConversationItemInputAudioTranscriptionSegment) for s in segments)
    completed = [e for e in events if e.type.endswith("transcription.completed")]
    assert {s.speaker for s in segments} == {"S1", "S2"}
    assert " ".join(s.text for s in segments).split() == " ".join(c.transcript for c in completed).split()
    assert all(a.speaker != b.speaker for a, b in itertools.pairwise(segments) if a.item_id == b.item_id)
    assert all(s.start < s.end for s in segments)
    plain = asyncio.run(run("gpt-4o-transcribe"))
    assert not [e for e in plain if e.type.endswith(".segment")]
