"""A client's prompt (names, terms, spelling) on both wires: Whisper reads it as the text said
before each window, and a name it cannot spell alone comes out right."""

import asyncio
import io
import json
from urllib.parse import quote

import numpy as np
import pytest
import soundfile
import soxr
from websockets.asyncio.client import connect

from clients.audio import float32_to_pcm16
from realtime.config import ServerConfig
from tests.conftest import espeak
from tests.server_harness import ServerThread, events_until, stream
from tests.test_openai_realtime import b64, client, events_until_completed
from voxtral.whisper.runner import WhisperRunner

SENTENCE, NAME = "Please send the report to Siobhan Okonkwo before Friday.", "Siobhan Okonkwo"


@pytest.fixture(scope="module")
def server(whisper_model):
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(api_key="sk-test"))
    yield harness
    harness.stop()


@pytest.fixture(scope="module")
def named(tmp_path_factory) -> np.ndarray:
    speech = espeak(SENTENCE, tmp_path_factory.mktemp("prompt") / "named.wav")
    return np.concatenate([speech, np.zeros(8000, np.float32)])


def test_vllm_wire_prompt_spells_the_name(server, named):
    headers = {"Authorization": "Bearer sk-test"}
    texts = []
    with server.connect(additional_headers=headers) as ws:
        long = "Nothing new to report this week. " * 300 + f"{NAME} is our new colleague."
        updates = ({}, {"prompt": f"{NAME} is our new colleague."}, {"language": "en"}, {"prompt": long})
        for update in updates:
            ws.send(json.dumps({"type": "session.update", **update}))
            stream(ws, named, chunk=len(named))  # whole: the text must not depend on step timing
            texts.append(events_until(ws, "transcription.done")[-1]["text"])
    unprompted, prompted, kept, longest = texts
    assert NAME not in unprompted, "the name must be one the model cannot spell unprompted"
    assert NAME in prompted and NAME in kept, texts  # the prompt holds for the session's next turns
    assert NAME in longest, texts  # a prompt past Whisper's bound keeps its last words


def test_openai_wire_prompt_spells_the_name(server, named):
    audio = soxr.resample(named, 16000, 24000)

    def session(prompt: str | None) -> dict:
        transcription = {"model": "whisper-tiny.en", **({"prompt": prompt} if prompt else {})}
        return {
            "type": "transcription",
            "audio": {"input": {"transcription": transcription, "turn_detection": None}},
        }

    async def run() -> list:
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            for prompt in (None, f"{NAME} is our new colleague."):
                await connection.session.update(session=session(prompt))
                await connection.input_audio_buffer.append(audio=b64(audio))
                await connection.input_audio_buffer.commit()
            return await events_until_completed(connection, 2)

    events = asyncio.run(run())
    updated = [e for e in events if e.type == "session.updated"]
    assert updated[-1].session.audio.input.transcription.prompt == f"{NAME} is our new colleague."
    unprompted, prompted = (
        e.transcript for e in events if e.type == "conversation.item.input_audio_transcription.completed"
    )
    assert NAME not in unprompted and NAME in prompted, (unprompted, prompted)


def test_keyterms_spell_the_name_on_every_wire(server, named):
    """One session option, mapped by each wire onto the one the engine reads: vLLM's
    `session.update`, OpenAI's `transcription` (both voxrt's extension), the file API's
    `keyterms[]` and Deepgram's `keyterm`."""
    headers = {"Authorization": "Bearer sk-test"}
    with server.connect(additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "session.update", "keyterms": [NAME]}))
        stream(ws, named, chunk=len(named))
        vllm = events_until(ws, "transcription.done")[-1]["text"]

    async def openai_realtime() -> str:
        transcription = {"model": "whisper-tiny.en", "keyterms": [NAME]}
        audio = {"input": {"transcription": transcription, "turn_detection": None}}
        session = {"type": "transcription", "audio": audio}
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            await connection.session.update(session=session)
            await connection.input_audio_buffer.append(audio=b64(soxr.resample(named, 16000, 24000)))
            await connection.input_audio_buffer.commit()
            events = await events_until_completed(connection, 1)
        updated = [e for e in events if e.type == "session.updated"][-1]
        assert updated.session.audio.input.transcription.model_extra["keyterms"] == [NAME]
        return events[-1].transcript

    recording = io.BytesIO()
    soundfile.write(recording, named, 16000, format="WAV")
    upload = client(server).audio.transcriptions.create(
        file=("named.wav", recording.getvalue()), model="whisper-1", extra_body={"keyterms": [NAME]}
    )

    async def deepgram() -> str:
        url = f"ws://127.0.0.1:{server.server.port}/v1/listen?encoding=linear16&sample_rate=16000&keyterm={quote(NAME)}"
        async with connect(url, additional_headers={"Authorization": "Token sk-test"}) as ws:
            await ws.send(float32_to_pcm16(named))
            await ws.send(json.dumps({"type": "CloseStream"}))
            messages = [json.loads(m) async for m in ws]
        finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
        return " ".join(m["channel"]["alternatives"][0]["transcript"] for m in finals)

    texts = [vllm, asyncio.run(openai_realtime()), asyncio.run(upload).text, asyncio.run(deepgram())]
    assert all(NAME in text for text in texts), texts
