"""OpenAI's Realtime transcription protocol, driven by the real `openai` SDK, and vLLM's own client."""

import asyncio
import base64
import dataclasses
import json

import numpy as np
import pytest
import soxr
from openai import AsyncOpenAI
from websockets.sync.client import connect

from benchmarks.real_speech import recording
from benchmarks.text import normalize_words, word_error_rate
from clients.audio import float32_to_pcm16
from realtime.config import ServerConfig
from realtime.protocols.openai_wire import LOGPROBS
from tests.conftest import espeak
from tests.server_harness import TINY_EN, ServerThread, events_until
from voxtral.whisper.runner import WhisperRunner

SENTENCES = [
    "The library opens in the morning and closes in the evening.",
    "You can borrow many books and keep them for a while.",
    "Please turn off your phone and speak softly.",
]


@pytest.fixture(scope="module")
def server(whisper_model):
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(api_key="sk-test"), max_sessions=8)
    yield harness
    harness.stop()


@pytest.fixture(scope="module")
def turns(tmp_path_factory) -> list[np.ndarray]:
    """Each sentence at 24 kHz, OpenAI's rate, followed by 1.2 s of silence."""
    tmp = tmp_path_factory.mktemp("turns")
    out = []
    for i, sentence in enumerate(SENTENCES):
        speech = espeak(sentence, tmp / f"{i}.wav", voice=["en-us", "en+m3", "en-us+f2"][i])
        out.append(
            np.concatenate([soxr.resample(speech, 16000, 24000), np.zeros(int(1.2 * 24000), np.float32)])
        )
    return out


def client(server: ServerThread) -> AsyncOpenAI:
    return AsyncOpenAI(
        api_key="sk-test", base_url=server.http + "/v1", websocket_base_url=server.url[: -len("/realtime")]
    )


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(float32_to_pcm16(samples)).decode()


async def send_audio(connection, samples: np.ndarray, speed: float) -> None:
    """200 ms events, paced at `speed` x real time."""
    for offset in range(0, len(samples), 4800):
        await connection.input_audio_buffer.append(audio=b64(samples[offset : offset + 4800]))
        await asyncio.sleep(0.2 / speed)


def transcription_session(turn_detection: dict | None) -> dict:
    return {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": turn_detection,
            }
        },
    }


async def events_until_completed(connection, count: int, timeout: float = 60) -> list:
    events = []

    async def collect() -> None:
        async for event in connection:
            events.append(event)
            completed = [
                e for e in events if e.type == "conversation.item.input_audio_transcription.completed"
            ]
            if len(completed) == count:
                return

    try:
        await asyncio.wait_for(collect(), timeout)
    except TimeoutError:
        raise AssertionError(f"not {count} completed items: {[e.type for e in events]}") from None
    return events


def check_items(events: list, expected: list[str]) -> None:
    """One committed item per turn, each completed once, its deltas adding up to its transcript."""
    committed = [e.item_id for e in events if e.type == "input_audio_buffer.committed"]
    completed = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    assert [e.item_id for e in completed] == committed and len(set(committed)) == len(expected)
    previous = [e.previous_item_id for e in events if e.type == "input_audio_buffer.committed"]
    assert previous == [None, *committed[:-1]]
    for item in completed:
        deltas = [
            e.delta
            for e in events
            if getattr(e, "item_id", None) == item.item_id and e.type.endswith(".delta")
        ]
        assert "".join(deltas) == item.transcript
        assert item.usage.type == "duration" and item.usage.seconds > 1
    heard = " ".join(e.transcript for e in completed)
    assert word_error_rate(" ".join(expected), heard) <= 0.2, heard


@pytest.mark.slow
def test_openai_sdk_server_vad_gives_an_item_per_turn(server, turns):
    async def run() -> list:
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            created = await connection.recv()
            assert created.type == "session.created" and created.session.type == "transcription"
            vad = {
                "type": "server_vad",
                "threshold": 0.5,
                "prefix_padding_ms": 300,
                "silence_duration_ms": 500,
            }
            await connection.session.update(session=transcription_session(vad))
            # Real time, as from a microphone: a turn ends where the VAD hears it end as audio arrives.
            await send_audio(connection, np.concatenate(turns), speed=1.0)
            return [created, *await events_until_completed(connection, len(turns))]

    events = asyncio.run(run())
    updated = next(e for e in events if e.type == "session.updated")
    assert updated.session.audio.input.turn_detection.silence_duration_ms == 500
    check_items(events, SENTENCES)
    started = [e for e in events if e.type == "input_audio_buffer.speech_started"]
    stopped = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    committed = [e.item_id for e in events if e.type == "input_audio_buffer.committed"]
    assert [e.item_id for e in started] == [e.item_id for e in stopped] == committed
    # Turn times on the session's clock: the sentences' places in the audio sent (a start
    # includes the 300 ms prefix padding; a stop is where the 1.2 s of silence begins).
    ends = np.cumsum([len(t) / 24 for t in turns])
    for i, (start, stop) in enumerate(zip(started, stopped, strict=True)):
        begin = ends[i - 1] if i else 0
        assert begin - 350 <= start.audio_start_ms < stop.audio_end_ms <= ends[i] - 900, (i, start, stop)


def test_a_client_sending_faster_than_real_time_gets_items_cut_where_the_vad_cut(server, turns):
    """A file uploaded at 50x real time: the VAD hears every turn end long before the model
    decodes it, and each item still holds its own turn's words and none of the next one's."""

    async def run() -> list:
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            vad = {"type": "server_vad", "silence_duration_ms": 500}
            await connection.session.update(session=transcription_session(vad))
            await send_audio(connection, np.concatenate(turns), speed=50.0)
            return await events_until_completed(connection, len(turns))

    events = asyncio.run(run())
    check_items(events, SENTENCES)
    completed = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    words = [set(normalize_words(sentence)) for sentence in SENTENCES]
    for i, item in enumerate(completed):
        assert word_error_rate(SENTENCES[i], item.transcript) <= 0.2, (i, item.transcript)
        others = set().union(*words[:i], *words[i + 1 :]) - words[i]
        assert not others & set(normalize_words(item.transcript)), (i, item.transcript)


@pytest.mark.slow
def test_openai_sdk_manual_commits_without_turn_detection(server, turns):
    async def run() -> list:
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            await connection.session.update(session=transcription_session(None))
            for turn in turns[:2]:
                await send_audio(connection, turn, speed=10.0)
                await connection.input_audio_buffer.commit()
            return await events_until_completed(connection, 2)

    events = asyncio.run(run())
    assert not [e for e in events if e.type.startswith("input_audio_buffer.speech_")]
    check_items(events, SENTENCES[:2])


def test_openai_sdk_logprobs_when_included_and_only_then(server, turns):
    async def run() -> list:
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            session = transcription_session(None)
            await connection.session.update(session={**session, "include": [LOGPROBS]})
            await send_audio(connection, turns[0], speed=10.0)
            await connection.input_audio_buffer.commit()
            await connection.session.update(session={**session, "include": []})
            await send_audio(connection, turns[1], speed=10.0)
            await connection.input_audio_buffer.commit()
            return await events_until_completed(connection, 2)

    events = asyncio.run(run())
    check_items(events, SENTENCES[:2])
    updates = [e for e in events if e.type == "session.updated"]
    assert [u.session.include for u in updates] == [[LOGPROBS], []]
    first, second = [e.item_id for e in events if e.type == "input_audio_buffer.committed"]
    spoken = [
        e for e in events if getattr(e, "item_id", None) == first and e.type.endswith(("delta", "completed"))
    ]
    for event in spoken:  # parsed by the SDK into its LogProbProperties
        text = event.delta if event.type.endswith("delta") else event.transcript
        assert "".join(p.token for p in event.logprobs).strip() == text.strip()
        assert all(p.logprob <= 0 and bytes(p.bytes).decode() == p.token for p in event.logprobs)
    completed = spoken[-1]
    assert completed.logprobs == [p for e in spoken[:-1] for p in e.logprobs]
    plain = [
        e for e in events if getattr(e, "item_id", None) == second and e.type.endswith(("delta", "completed"))
    ]
    assert plain and all("logprobs" not in e.model_fields_set for e in plain)


def test_openai_sdk_bad_events_get_openai_errors_and_the_session_goes_on(server, turns):
    async def run() -> list:
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            await connection.recv()  # session.created
            await connection.send({"type": "input_audio_buffer.commit", "event_id": "ev-empty"})
            await connection.send({"type": "response.create", "event_id": "ev-response"})
            await connection.send(
                {"type": "session.update", "event_id": "ev-realtime", "session": {"type": "realtime"}}
            )
            await connection.input_audio_buffer.append(audio="%%%not base64", event_id="ev-audio")
            await connection.session.update(
                session={
                    "type": "transcription",
                    "audio": {"input": {"format": {"type": "audio/pcmu", "rate": 24000}}},
                },
                event_id="ev-format",
            )
            errors = [await connection.recv() for _ in range(5)]
            await connection.session.update(session=transcription_session(None))
            await send_audio(connection, turns[0], speed=10.0)
            await connection.input_audio_buffer.commit()
            return errors + await events_until_completed(connection, 1)

    events = asyncio.run(run())
    errors = [(e.type, e.error.type, e.error.code, e.error.event_id) for e in events[:5]]
    assert errors == [
        ("error", "invalid_request_error", "input_audio_buffer_commit_empty", "ev-empty"),
        ("error", "invalid_request_error", "invalid_event", "ev-response"),
        ("error", "invalid_request_error", "invalid_value", "ev-realtime"),
        ("error", "invalid_request_error", "invalid_audio", "ev-audio"),
        ("error", "invalid_request_error", "invalid_value", "ev-format"),
    ]
    assert all(e.error.message for e in events[:5])
    check_items(events[5:], SENTENCES[:1])


def test_first_event_picks_openai_on_a_plain_url_with_the_beta_form(server, turns):
    """An OpenAI client that does not say so in the URL, sending the older `transcription_session.update`."""
    with connect(server.url, additional_headers={"Authorization": "Bearer sk-test"}) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        update = {
            "input_audio_format": "pcm16",
            "turn_detection": None,
            "input_audio_transcription": {"model": "whisper-1"},
        }
        ws.send(json.dumps({"type": "transcription_session.update", "session": update}))
        updated = json.loads(ws.recv(timeout=10))
        assert updated["type"] == "session.updated"
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        for offset in range(0, len(turns[1]), 4800):
            ws.send(
                json.dumps(
                    {"type": "input_audio_buffer.append", "audio": b64(turns[1][offset : offset + 4800])}
                )
            )
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        events = events_until(ws, "conversation.item.input_audio_transcription.completed")
    assert [e["type"] for e in events][:2] == ["input_audio_buffer.committed", "conversation.item.added"]
    assert word_error_rate(SENTENCES[1], events[-1]["transcript"]) <= 0.2, events[-1]


def test_vllm_realtime_client_with_its_default_flags(server, tmp_path):
    """What vLLM's `examples/online_serving/openai_realtime_client.py` does: its default model
    name, 4,096-byte chunks sent at once, then the final commit."""
    speech = espeak(" ".join(SENTENCES), tmp_path / "speech.wav")
    pcm = float32_to_pcm16(speech)
    with connect(server.url, additional_headers={"Authorization": "Bearer sk-test"}) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "model": "mistralai/Voxtral-Mini-4B-Realtime-2602"}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        for i in range(0, len(pcm), 4096):
            chunk = base64.b64encode(pcm[i : i + 4096]).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        events = events_until(ws, "transcription.done", timeout=120)
    assert not [e for e in events if e["type"] == "error"], events
    assert word_error_rate(" ".join(SENTENCES), events[-1]["text"]) <= 0.2, events[-1]


def test_strict_model_refuses_a_model_it_does_not_serve(whisper_model):
    strict = dataclasses.replace(TINY_EN, strict_model=True)
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(), max_sessions=2, model=strict)
    try:
        with harness.connect() as ws:
            ws.send(json.dumps({"type": "session.update", "model": "whisper-tiny.en"}))
            ws.send(
                json.dumps({"type": "session.update", "model": "mistralai/Voxtral-Mini-4B-Realtime-2602"})
            )
            error = json.loads(ws.recv(timeout=10))
            assert (error["type"], error["code"]) == ("error", "unknown_model")
    finally:
        harness.stop()


def test_manual_commits_keep_the_session_clock_on_the_audio_sent(server, turns):
    """A commit flushes what the 24 kHz resampler still holds into the item: the session's
    clock (`audio_start_ms` and `audio_end_ms` count on it) moves by it too, or every commit
    would leave the clock behind the audio by the resampler's delay."""
    url = server.url + "?intent=transcription"
    with connect(url, additional_headers={"Authorization": "Bearer sk-test"}) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": transcription_session(None)}))
        for turn in turns:
            for offset in range(0, len(turn), 4800):
                ws.send(
                    json.dumps(
                        {"type": "input_audio_buffer.append", "audio": b64(turn[offset : offset + 4800])}
                    )
                )
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        for _ in turns:
            events_until(ws, "conversation.item.input_audio_transcription.completed")
        sent = sum(len(t) for t in turns) / 24000
        (connection,) = [c for c in server.server.connections if abs(c.seats.audio_seconds - sent) < 0.01]
        assert connection.wire.session_samples == round(connection.seats.audio_seconds * 16000)


@pytest.mark.slow
def test_model_url_16khz_longer_vad_silence_clear_and_item_done(server, turns):
    """`?model=` picks OpenAI's wire; 16 kHz (voxrt's extension) goes in unresampled; a
    `silence_duration_ms` longer than the pause between two sentences keeps them one item;
    `clear` drops the buffer's audio unheard; each item ends with `conversation.item.done`."""
    url = server.url + "?model=gpt-4o-transcribe"
    at_16k = [soxr.resample(turn, 24000, 16000) for turn in turns]
    with connect(url, additional_headers={"Authorization": "Bearer sk-test"}) as ws:
        created = json.loads(ws.recv(timeout=10))
        assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
        vad = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 2000}
        session = transcription_session(vad)
        session["audio"]["input"]["format"]["rate"] = 16000
        ws.send(json.dumps({"type": "session.update", "session": session}))
        updated = json.loads(ws.recv(timeout=10))
        assert updated["session"]["audio"]["input"]["format"]["rate"] == 16000
        assert updated["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 2000

        def send(samples: np.ndarray) -> None:
            for offset in range(0, len(samples), 3200):
                append = {"type": "input_audio_buffer.append", "audio": b64(samples[offset : offset + 3200])}
                ws.send(json.dumps(append))

        send(at_16k[2][: 16000 // 2])  # half a second of the third sentence, then cleared
        ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        cleared = events_until(ws, "input_audio_buffer.cleared")
        assert [e for e in cleared if e["type"] == "error"] == [], cleared
        send(np.concatenate([at_16k[0], at_16k[1], np.zeros(3 * 16000, np.float32)]))
        events = events_until(ws, "conversation.item.done")
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    (completed,) = [e for e in events if e["type"].endswith("input_audio_transcription.completed")]
    assert len(committed) == 1 and events[-1]["item"]["id"] == completed["item_id"] == committed[0]["item_id"]
    # Both sentences in one item (1.2 s pauses under a 2 s silence), nothing of the cleared one.
    assert word_error_rate(" ".join(SENTENCES[:2]), completed["transcript"]) <= 0.2, completed
    assert events[-1]["item"]["content"][0]["transcript"] == completed["transcript"]


@pytest.mark.slow
def test_semantic_vad_keeps_a_sentence_paused_in_its_middle_in_one_item(server):
    """A reader's 1.2 s pause after "It was the age of": server_vad ends a turn there;
    semantic_vad hears the sentence unfinished and ends it once, after "wisdom", in one item."""
    from tests.test_turn_model import MID_SENTENCE, PAUSE_SECONDS, spoken

    audio, pause = spoken(recording("two_cities").audio, MID_SENTENCE)
    audio = np.concatenate([audio, np.zeros(3 * 16000, np.float32)])  # past semantic_vad's longest pause
    resumed_ms = (pause + PAUSE_SECONDS) * 1000

    async def turns(turn_detection: dict) -> tuple[list[int], str]:
        """Where each turn ended, through the one after the pause; that one's transcript."""
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            await connection.recv()  # session.created
            await connection.session.update(session=transcription_session(turn_detection))
            updated = await connection.recv()
            assert updated.session.audio.input.turn_detection.type == turn_detection["type"]
            sender = asyncio.create_task(send_audio(connection, soxr.resample(audio, 16000, 24000), 2.0))
            ends, last = [], None
            async for event in connection:
                assert event.type != "error", event
                if event.type == "input_audio_buffer.speech_stopped":
                    ends.append(event.audio_end_ms)
                    if event.audio_end_ms > resumed_ms:
                        last = event.item_id
                if event.type.endswith("transcription.completed") and event.item_id == last:
                    await sender
                    return ends, event.transcript
        raise AssertionError("closed")

    silence, _ = asyncio.run(asyncio.wait_for(turns({"type": "server_vad"}), 60))
    semantic, said = asyncio.run(asyncio.wait_for(turns({"type": "semantic_vad", "eagerness": "auto"}), 60))
    assert len(silence) == 2 and silence[0] < resumed_ms, silence
    assert len(semantic) == 1 and "age of" in said.lower(), (semantic, said)  # the item holds both parts
