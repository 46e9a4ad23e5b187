"""Deepgram's live wire (`/v1/listen`), driven by Deepgram's own Python SDK as voice-agent
frameworks drive it: a real call's words in final and interim results, turns ended with
`speech_final` and `UtteranceEnd`, a phone line's mu-law, `Finalize` and `CloseStream`, the
query's errors refused at the upgrade, its keys, its idle close, and a hostile client beside
a bystander who is unharmed."""

import asyncio
import hashlib
import json
import time

import numpy as np
import pytest
from deepgram import AsyncDeepgramClient
from deepgram.environment import DeepgramClientEnvironment
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from benchmarks import telephone
from benchmarks.conversation_set import phone_call
from benchmarks.real_speech import recording
from benchmarks.text import whisper_wer
from clients.audio import float32_to_pcm16
from realtime.config import ServerConfig
from tests.conftest import espeak, wait_for
from tests.server_harness import ServerThread
from voxtral.whisper.runner import WhisperRunner

pytestmark = pytest.mark.slow
KEY = "dg-test"
MOST_WER = 0.35  # tiny.en on the call errs at about 0.2; a call half heard at 0.5 or more
# Through a phone line's coding (36 dB of quantization noise) tiny.en streams it a little worse.
MOST_WER_G711 = 0.4
CHUNK_SECONDS = 0.1
SENTENCES = ["The library opens in the morning and closes in the evening.", "Please turn off your phone."]


@pytest.fixture(scope="module")
def server(whisper_model):
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(api_key=KEY), max_sessions=8)
    yield harness
    harness.stop()


@pytest.fixture(scope="module")
def call():
    return phone_call()


@pytest.fixture(scope="module")
def two_turns(tmp_path_factory) -> tuple[np.ndarray, float]:
    """Two sentences with 2 s of silence between them and 1.5 s after; where the second starts."""
    tmp = tmp_path_factory.mktemp("deepgram")
    first, second = (espeak(s, tmp / f"{i}.wav") for i, s in enumerate(SENTENCES))
    pause, tail = np.zeros(32000, np.float32), np.zeros(24000, np.float32)
    return np.concatenate([first, pause, second, tail]), (len(first) + len(pause)) / 16000


def listen_live(server: ServerThread, **options: str):
    """Deepgram's SDK's live connection to the server, with `options` as its query (the model
    a voice agent names, linear16 at 16 kHz, unless `options` says otherwise)."""
    base = f"127.0.0.1:{server.server.port}"
    environment = DeepgramClientEnvironment(
        base=f"http://{base}", production=f"ws://{base}", agent=f"ws://{base}", agent_rest=f"http://{base}"
    )
    options = {"model": "nova-3", "encoding": "linear16", "sample_rate": "16000", **options}
    return AsyncDeepgramClient(api_key=KEY, environment=environment).listen.v1.connect(**options)


def raw(server: ServerThread, query: str, headers: dict | None = None, subprotocols: list[str] | None = None):
    """A plain WebSocket client on `/v1/listen?query`, with Deepgram's key header unless told otherwise."""
    url = f"ws://127.0.0.1:{server.server.port}/v1/listen?{query}"
    headers = {"Authorization": f"Token {KEY}"} if headers is None else headers
    return connect(url, additional_headers=headers, subprotocols=subprotocols)


async def send(connection, data: bytes, bytes_per_second: int, speed: float) -> None:
    """`data` in 100 ms frames, paced at `speed` x real time."""
    step = int(bytes_per_second * CHUNK_SECONDS)
    for offset in range(0, len(data), step):
        await connection.send_media(data[offset : offset + step])
        await asyncio.sleep(CHUNK_SECONDS / speed)


async def listen(connection, until: str = "Metadata") -> list[dict]:
    """Every message as a dict, through the one of type `until`."""
    out = []
    async for message in connection:
        out.append(message.dict())
        if out[-1]["type"] == until:
            return out
    raise AssertionError(f"closed before {until}: {out[-3:]}")


def finals(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["type"] == "Results" and m["is_final"]]


def transcript(messages: list[dict]) -> str:
    return " ".join(t for m in finals(messages) if (t := m["channel"]["alternatives"][0]["transcript"]))


def pcm(audio: np.ndarray) -> bytes:
    return float32_to_pcm16(audio)


def test_a_call_streamed_through_deepgrams_sdk_comes_back_in_final_and_interim_results(server, call):
    """With speakers asked for (`diarize`): each word carries its speaker's number."""
    data = pcm(call.audio)

    async def run() -> list[dict]:
        async with listen_live(server, interim_results="true", diarize="true") as connection:
            sender = asyncio.create_task(send(connection, data, 32000, speed=8.0))
            await sender
            await connection.send_close_stream()
            return await listen(connection)

    messages = asyncio.run(asyncio.wait_for(run(), 120))
    assert whisper_wer(call.text, transcript(messages)) <= MOST_WER, transcript(messages)
    interim = [m for m in messages if m["type"] == "Results" and not m["is_final"]]
    assert any(m["channel"]["alternatives"][0]["transcript"] for m in interim)
    # Each final result is the audio after the one before, and holds the words said in it.
    end = 0.0
    for result in finals(messages):
        assert result["start"] == pytest.approx(end, abs=0.002)
        end = result["start"] + result["duration"]
        for word in result["channel"]["alternatives"][0]["words"]:
            assert result["start"] - 0.002 <= word["start"] <= word["end"] <= end + 0.002
            assert word["word"] == word["word"].lower() and word["punctuated_word"]
            assert 0 <= word["confidence"] <= 1 and word["speaker"] in (0, 1, 2, 3)
        assert result["metadata"]["request_id"] == messages[-1]["request_id"]
    assert messages[-1]["type"] == "Metadata"
    assert messages[-1]["duration"] == pytest.approx(30.0, abs=0.01)
    assert messages[-1]["sha256"] == hashlib.sha256(data).hexdigest()


def test_turns_end_with_speech_final_and_an_utterance_end_after_the_gap(server, two_turns):
    audio, second_starts = two_turns

    async def run() -> list[dict]:
        options = {
            "interim_results": "true",
            "utterance_end_ms": "1000",
            "vad_events": "true",
            "endpointing": "500",
        }
        async with listen_live(server, **options) as connection:
            await send(connection, pcm(audio), 32000, speed=4.0)
            await connection.send_close_stream()
            return await listen(connection)

    messages = asyncio.run(asyncio.wait_for(run(), 120))
    kinds = [m["type"] for m in messages]
    assert kinds.count("SpeechStarted") == 2
    assert kinds.count("UtteranceEnd") >= 1
    ends = [m for m in messages if m["type"] == "UtteranceEnd"]
    # The first comes between the turns, after the first turn's last word, before the second's words.
    first_end = kinds.index("UtteranceEnd")
    before = [w for m in finals(messages[:first_end]) for w in m["channel"]["alternatives"][0]["words"]]
    assert before and ends[0]["last_word_end"] == pytest.approx(before[-1]["end"], abs=0.002)
    assert before[-1]["end"] < second_starts
    later = [w for m in finals(messages[first_end:]) for w in m["channel"]["alternatives"][0]["words"]]
    assert later and all(w["start"] >= second_starts - 0.5 for w in later)
    speech_finals = [m for m in finals(messages) if m["speech_final"]]
    assert len(speech_finals) == 2
    assert speech_finals[0]["start"] + speech_finals[0]["duration"] < second_starts
    assert whisper_wer(" ".join(SENTENCES), transcript(messages)) <= 0.2, transcript(messages)


async def pipecats_finals(port: int, audio: np.ndarray, last_word: str) -> list[str]:
    """The final transcriptions pipecat's Deepgram STT service (as pipecat-ai ships it) pushes
    down its pipeline for `audio` sent in real time, once one of them holds `last_word`."""
    from pipecat.frames.frames import EndFrame, Frame, InputAudioRawFrame, TranscriptionFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.deepgram.stt import DeepgramSTTService
    from pipecat.workers.runner import WorkerRunner

    texts: list[str] = []
    started, heard = asyncio.Event(), asyncio.Event()

    class Finals(FrameProcessor):
        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TranscriptionFrame):
                texts.append(frame.text)
                if last_word in frame.text.lower():
                    heard.set()
            await self.push_frame(frame, direction)

    stt = DeepgramSTTService(api_key=KEY, base_url=f"http://127.0.0.1:{port}", sample_rate=16000)
    worker = PipelineWorker(Pipeline([stt, Finals()]), cancel_on_idle_timeout=False)

    @worker.event_handler("on_pipeline_started")
    async def on_started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    async def feed() -> None:
        await asyncio.wait_for(started.wait(), 60)
        for offset in range(0, len(audio), 1600):  # 100 ms frames, as a transport hands them over
            await worker.queue_frame(InputAudioRawFrame(pcm(audio[offset : offset + 1600]), 16000, 1))
            await asyncio.sleep(0.1)
        await asyncio.wait_for(heard.wait(), 60)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), feed())
    return texts


def test_pipecats_deepgram_service_transcribes_through_the_server(server, two_turns):
    """A voice-agent framework's plugin, unchanged, pointed at the server by its `base_url`."""
    texts = asyncio.run(pipecats_finals(server.server.port, two_turns[0], "phone"))
    assert whisper_wer(" ".join(SENTENCES), " ".join(texts)) <= 0.2, texts


def test_eot_threshold_keeps_a_sentence_paused_in_its_middle_one_turn(server):
    """voxrt's extension (Flux's names): with `eot_threshold` a reader's 1.2 s pause after "It
    was the age of" is no `speech_final`; with endpointing alone it is one."""
    from tests.test_turn_model import MID_SENTENCE, spoken

    audio, pause = spoken(recording("two_cities").audio, MID_SENTENCE)

    async def speech_finals(**options) -> list[float]:
        async with listen_live(server, endpointing="300", **options) as connection:
            await send(connection, pcm(audio), 32000, speed=4.0)
            await connection.send_close_stream()
            messages = await listen(connection)
        return [m["start"] + m["duration"] for m in finals(messages) if m["speech_final"]]

    silence = asyncio.run(asyncio.wait_for(speech_finals(), 60))
    extension = {"additional_query_parameters": {"eot_threshold": "0.5", "eot_timeout_ms": "2000"}}
    semantic = asyncio.run(asyncio.wait_for(speech_finals(request_options=extension), 60))
    assert len(silence) == 2 and silence[0] < pause + 1.0, silence
    assert len(semantic) == 1 and semantic[0] > pause + 1.2, semantic


@pytest.mark.parametrize("encoding", ["mulaw"])  # A-law: on OpenAI's wire (test_conversations)
def test_a_phone_lines_g711_at_8_khz_gives_the_calls_words(server, call, encoding):
    coded = telephone.coded(call.audio, encoding)  # the standard library's G.711 coder

    async def run() -> list[dict]:
        async with listen_live(server, encoding=encoding, sample_rate="8000") as connection:
            await send(connection, coded, 8000, speed=8.0)
            await connection.send_close_stream()
            return await listen(connection)

    messages = asyncio.run(asyncio.wait_for(run(), 120))
    assert whisper_wer(call.text, transcript(messages)) <= MOST_WER_G711, transcript(messages)
    assert messages[-1]["duration"] == pytest.approx(30.0, abs=0.01)


def test_finalize_sends_what_was_said_from_finalize_and_the_stream_goes_on(server, two_turns):
    audio, second_starts = two_turns
    cut = int(second_starts * 16000) - 16000  # in the pause, before the second sentence

    async def run() -> tuple[list[dict], list[dict]]:
        async with listen_live(server, endpointing="false") as connection:
            await send(connection, pcm(audio[:cut]), 32000, speed=8.0)
            await connection.send_finalize()
            first = []
            while not any(m["type"] == "Results" and m["from_finalize"] for m in first):
                first.append((await connection.recv()).dict())
            await send(connection, pcm(audio[cut:]), 32000, speed=8.0)
            await connection.send_close_stream()
            return first, await listen(connection)

    first, rest = asyncio.run(asyncio.wait_for(run(), 120))
    assert whisper_wer(SENTENCES[0], transcript(first)) <= 0.3, transcript(first)
    assert whisper_wer(SENTENCES[1], transcript(rest)) <= 0.3, transcript(rest)
    assert not any(m.get("speech_final") for m in first + rest)  # endpointing=false: no turn ends
    # The second part's words are on the session's clock, after the first part's audio.
    words = [w for m in finals(rest) for w in m["channel"]["alternatives"][0]["words"]]
    assert words and words[0]["start"] >= second_starts - 0.5


@pytest.mark.parametrize(
    "query",
    [
        "sample_rate=16000",  # no encoding
        "encoding=opus&sample_rate=16000",
        "encoding=linear16",  # no rate
        "encoding=linear16&sample_rate=16000&channels=2",
        "encoding=linear16&sample_rate=16000&utterance_end_ms=1000",  # without interim_results
        "encoding=linear16&sample_rate=16000&interim_results=yes",
        "encoding=linear16&sample_rate=16000&language=fr",  # tiny.en hears English only
        "encoding=linear16&sample_rate=16000&eot_threshold=2",
    ],
)
def test_a_wrong_query_is_refused_at_the_upgrade_with_deepgrams_error(server, query):
    async def run() -> InvalidStatus:
        with pytest.raises(InvalidStatus) as refused:
            async with raw(server, query):
                pass
        return refused.value

    response = asyncio.run(run()).response
    assert response.status_code == 400
    body = json.loads(response.body)
    assert body["err_code"] and body["err_msg"] and body["request_id"]
    assert response.headers["dg-error"]


def test_deepgrams_keys_token_header_and_subprotocol(server):
    query = "encoding=linear16&sample_rate=16000"

    async def run() -> None:
        for headers, subprotocols in (
            ({"Authorization": f"Token {KEY}"}, None),
            ({"Authorization": f"Bearer {KEY}"}, None),
            ({}, ["token", KEY]),
        ):
            async with raw(server, query, headers, subprotocols) as ws:
                assert ws.subprotocol == ("token" if subprotocols else None)
                await ws.send(json.dumps({"type": "CloseStream"}))
                assert json.loads(await ws.recv())["type"] == "Metadata"
        for headers, subprotocols in (
            ({"Authorization": "Token wrong"}, None),
            ({}, ["token", "wrong"]),
            ({}, None),
        ):
            with pytest.raises(InvalidStatus) as refused:
                async with raw(server, query, headers, subprotocols):
                    pass
            assert refused.value.response.status_code == 401
            assert json.loads(refused.value.response.body)["err_code"] == "INVALID_AUTH"

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_quiet_stream_is_closed_with_net_0001_10_s_after_its_last_keepalive(server):
    async def run() -> tuple[float, float]:
        async with raw(server, "encoding=linear16&sample_rate=16000") as ws:
            opened = time.monotonic()
            await asyncio.sleep(2)
            await ws.send(json.dumps({"type": "KeepAlive"}))
            kept = time.monotonic()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await ws.recv()
            assert closed.value.rcvd.code == 1011 and closed.value.rcvd.reason == "NET-0001"
            return time.monotonic() - opened, time.monotonic() - kept

    open_for, after_keepalive = asyncio.run(asyncio.wait_for(run(), 60))
    assert open_for >= 12 and 10 <= after_keepalive <= 20  # the KeepAlive held it past 10 s


def test_a_hostile_client_gets_errors_and_a_bystander_beside_it_is_unharmed(server, call):
    data = pcm(call.audio)

    async def attacker() -> list[dict]:
        errors = []
        async with raw(server, "encoding=linear16&sample_rate=16000") as ws:
            for bad in ("not json", "[]", '{"type": "Transcribe"}', '{"type": 7}', '{"type": "KeepAlive"'):
                await ws.send(bad)
                errors.append(json.loads(await ws.recv()))
            for odd in (b"\x01", b"\x02\x03\x04", bytes(range(256)) * 64):  # samples split across frames
                await ws.send(odd)
            await ws.send(json.dumps({"type": "CloseStream"}))
            async for message in ws:
                if json.loads(message)["type"] == "Metadata":
                    break
        return errors

    async def bystander() -> list[dict]:
        async with listen_live(server) as connection:
            await send(connection, data, 32000, speed=8.0)
            await connection.send_close_stream()
            return await listen(connection)

    async def both():
        return await asyncio.gather(attacker(), bystander())

    errors, messages = asyncio.run(asyncio.wait_for(both(), 120))
    assert all(e["type"] == "Error" and e["variant"] == "SchemaError" and e["description"] for e in errors)
    assert whisper_wer(call.text, transcript(messages)) <= MOST_WER, transcript(messages)
    wait_for(lambda: server.engine.stats().utterances == 0)  # every utterance of both left the engine
