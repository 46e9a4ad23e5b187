"""The server over a real socket, driven by the websockets client as any external client would."""

import asyncio
import contextlib
import io
import json
import logging
import socket
import threading
import time
import urllib.error

import numpy as np
import openai
import pytest
import soundfile
from websockets.exceptions import ConnectionClosed, InvalidStatus

from benchmarks.text import word_error_rate
from realtime.config import ServedModel, ServerConfig
from realtime.engine.loop import Engine
from realtime.limits import ConnectionLimits
from realtime.server import RealtimeServer
from realtime.sockets import uvicorn_server
from scheduler import RequestKind
from tests.conftest import espeak
from tests.server_harness import (
    WELCOME_SECONDS,
    Bystander,
    ServerThread,
    append_event,
    events_until,
    expect_error,
    hold_steps,
    stream,
    streaming_beside,
    unmeasured,
    wait_until,
)
from voxtral.whisper.runner import WhisperRunner

FIRST_SECONDS = (
    "Good morning everyone. Today we will talk about the weather in the city."  # welcome.wav[:4 s]
)


@pytest.fixture(scope="module")
def server(whisper_model):
    harness = ServerThread(
        WhisperRunner(whisper_model), ServerConfig(max_frame_bytes=256_000), max_sessions=40
    )
    yield harness
    harness.stop()


def health(server: ServerThread, path: str) -> tuple[int, str]:
    """The status code and `status` of a health endpoint, 503 included."""
    try:
        code, body = server.get(path)
    except urllib.error.HTTPError as error:
        code, body = error.code, error.read().decode()
    return code, json.loads(body)["status"]


def wait_until_idle(server: ServerThread, timeout: float = 30) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        metrics = server.metrics()
        idle = metrics["voxrt_engine_utterances"] == 0 and metrics["voxrt_connections_active"] == 0
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


@pytest.mark.slow
def test_happy_path_streams_deltas_before_the_final_commit(server, welcome):
    samples, text = welcome
    with server.connect() as ws:
        ws.send(json.dumps({"type": "session.update", "model": "whisper-tiny.en"}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        deltas_before_final = []
        # Paced by the engine, not by a clock: each second of audio goes once the engine has
        # stepped over the previous one, as when audio arrives in real time on a fast machine.
        for offset in range(0, len(samples), 16000):
            steps = server.metrics()["voxrt_engine_steps_total"]
            for piece in range(offset, min(offset + 16000, len(samples)), 1600):  # 100 ms chunks
                ws.send(append_event(samples[piece : piece + 1600]))
            deadline = time.monotonic() + 60
            # An item is cut once the samples its last frame looks at arrive: from the second on.
            while offset and server.metrics()["voxrt_engine_steps_total"] == steps:
                assert time.monotonic() < deadline, "the engine never stepped over the new audio"
                time.sleep(0.02)
            try:
                while True:
                    event = json.loads(ws.recv(timeout=0.05))
                    assert event["type"] == "transcription.delta", event
                    deltas_before_final.append(event["delta"])
            except TimeoutError:
                pass
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        events = events_until(ws, "transcription.done")
        assert len(deltas_before_final) >= 3, "deltas must flow while audio is still arriving"
        done = events[-1]
        deltas = deltas_before_final + [e["delta"] for e in events if e["type"] == "transcription.delta"]
        assert "".join(deltas) == done["text"]
        assert word_error_rate(text, done["text"]) <= 0.1, done["text"]
        assert done["usage"]["completion_tokens"] > 0 and done["usage"]["audio_seconds"] > 10
        # The same connection takes a next utterance.
        stream(ws, samples[: 16000 * 4])
        second = events_until(ws, "transcription.done")[-1]
        assert word_error_rate(FIRST_SECONDS, second["text"]) <= 0.3, second["text"]
    metrics = wait_until_idle(server)
    assert metrics["voxrt_encoder_cache_rows"] == 0
    assert metrics["voxrt_utterances_total"] >= 2 and metrics["voxrt_deltas_total"] >= 3
    assert metrics["voxrt_time_to_first_delta_seconds_count"] >= 1


def test_every_client_mistake_gets_its_error_code(server, welcome):
    with Bystander(server, welcome[0]), server.connect() as ws:
        expect_error(ws, "{not json", "invalid_json")
        expect_error(ws, "[1, 2]", "invalid_event")
        expect_error(ws, '"just a string"', "invalid_event")
        expect_error(ws, json.dumps({"no": "type"}), "invalid_event")
        expect_error(ws, json.dumps({"type": 7}), "invalid_event")
        expect_error(ws, json.dumps({"type": "conversation.item.create"}), "unknown_event")
        expect_error(ws, json.dumps({"type": "input_audio_buffer.append"}), "invalid_event")
        expect_error(ws, json.dumps({"type": "input_audio_buffer.append", "audio": 5}), "invalid_event")
        expect_error(ws, json.dumps({"type": "input_audio_buffer.commit", "final": "yes"}), "invalid_event")
        expect_error(ws, json.dumps({"type": "session.update", "model": ["x"]}), "invalid_event")
        expect_error(ws, json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}), "invalid_audio")
        expect_error(
            ws, json.dumps({"type": "input_audio_buffer.append", "audio": "AAE="[:3]}), "invalid_audio"
        )
        odd = json.dumps({"type": "input_audio_buffer.append", "audio": "AAEC"})  # 3 bytes
        expect_error(ws, odd, "invalid_audio")
        expect_error(ws, b"\x00\x01binary", "invalid_event")
        # tiny.en is English only: another language or translation is refused, naming what is served.
        refused = expect_error(
            ws, json.dumps({"type": "session.update", "language": "fr"}), "unsupported_language"
        )
        assert refused["error"].endswith("supported: en")
        expect_error(ws, json.dumps({"type": "session.update", "task": "translate"}), "unsupported_task")
        expect_error(ws, json.dumps({"type": "session.update", "task": "summarize"}), "invalid_value")
        ws.send(json.dumps({"type": "session.update", "language": "en"}))
        # A model voxrt does not serve is accepted as vLLM accepts it (`--strict-model` refuses it).
        ws.send(json.dumps({"type": "session.update", "model": "gpt-nonexistent"}))
        # After all that the session is still usable, and audio before any commit auto-starts it.
        ws.send(append_event(np.zeros(16000, np.float32)))
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        expect_error(ws, append_event(np.zeros(1600, np.float32)), "input_finished")
        done = events_until(ws, "transcription.done")[-1]
        assert done["text"] == ""
    metrics = wait_until_idle(server)
    assert metrics["voxrt_errors_total{code=invalid_event}"] >= 7
    assert metrics["voxrt_encoder_cache_rows"] == 0


def test_frame_over_the_limit_is_closed_with_1009(server, welcome):
    with Bystander(server, welcome[0]), server.connect() as ws:
        ws.send(append_event(np.zeros(200_000, np.float32)))  # ~530 kB of JSON
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1009
    with server.connect() as ws:  # the server carries on
        expect_error(ws, "{", "invalid_json")


def test_session_past_its_length_limit(whisper_model, welcome):
    """An utterance past the limit ends with an error; a session under it, its utterance
    running throughout, gets its text."""
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(), unmeasured(max_session_seconds=5.0))
    try:
        with (
            harness.connect() as ws,
            harness.connect() as beside,
            streaming_beside(beside, welcome[0][: WELCOME_SECONDS * 16000]),
        ):
            stream(ws, np.zeros(16000 * 7, np.float32), final=False)
            error = events_until(ws, "error")[-1]
            assert error["code"] == "session_too_long"
            # A new utterance on the same connection works.
            stream(ws, np.zeros(16000, np.float32))
            assert events_until(ws, "transcription.done")[-1]["text"] == ""
        assert wait_until_idle(harness)["voxrt_encoder_cache_rows"] == 0
    finally:
        harness.stop()


def test_too_many_sessions_and_api_key_are_refused_at_upgrade(whisper_model, welcome, caplog):
    """Wrong keys and one session too many are refused at the upgrade, while a session
    streaming beside them gets its whole text."""
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(api_key="s3cret"), max_sessions=2)
    samples, text = welcome
    auth = {"additional_headers": {"Authorization": "Bearer s3cret"}}
    try:
        with harness.connect(**auth) as bystander:
            half = len(samples) // 2
            stream(bystander, samples[:half], final=False)
            with pytest.raises(InvalidStatus) as refused:
                harness.connect()
            assert refused.value.response.status_code == 401
            # The code the file API answers a missing key with: one refusal, told alike on every path.
            assert json.loads(refused.value.response.body)["code"] == "invalid_api_key"
            with pytest.raises(InvalidStatus) as refused:
                harness.connect(additional_headers={"Authorization": "Bearer wrong"})
            assert refused.value.response.status_code == 401
            with pytest.raises(InvalidStatus) as refused:
                harness.connect(subprotocols=["realtime", "openai-insecure-api-key.wrong"])
            assert refused.value.response.status_code == 401
            # A browser's way: the key as a subprotocol; the server picks `realtime`, never the key.
            with harness.connect(subprotocols=["realtime", "openai-insecure-api-key.s3cret"]) as browser:
                assert browser.subprotocol == "realtime"
            assert health(harness, "/health/ready") == (200, "ok")
            with harness.connect(**auth):
                with pytest.raises(InvalidStatus) as refused:
                    harness.connect(**auth)
                assert refused.value.response.status_code == 503
                assert refused.value.response.headers["Retry-After"] == "5"
                assert json.loads(refused.value.response.body)["code"] == "server_busy"
                # Full: a load balancer sends it no new sessions, but it is alive.
                assert health(harness, "/health/ready") == (503, "at_capacity")
                assert health(harness, "/health/live") == (200, "at_capacity")
            stream(bystander, samples[half:])  # its commit finds the utterance running: it goes on
            done = events_until(bystander, "transcription.done")[-1]
            assert word_error_rate(text, done["text"]) <= 0.1, done["text"]
        wait_until(lambda: health(harness, "/health/ready")[0] == 200, 10)  # ready again once all closed
        metrics = harness.metrics()
        assert metrics["voxrt_errors_total{code=invalid_api_key}"] == 3
        assert metrics["voxrt_refusals_total{reason=server_busy}"] == 1
        # A refusal is the server's answer: nothing logs it as an error.
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        harness.stop()


def test_a_handshake_left_incomplete_without_a_denial_is_still_an_error():
    """Only the server's own refusals are kept out of the error log: an upgrade the app left
    unanswered is a bug, and is logged as one."""

    async def app(scope, receive, send) -> None:
        pass

    uvicorn_server(app, max_frame_bytes=1 << 20, close_seconds=1)
    record = logging.makeLogRecord(
        {
            "name": "uvicorn.error",
            "levelno": logging.ERROR,
            "msg": "ASGI callable returned without completing handshake.",
        }
    )
    assert logging.getLogger("uvicorn.error").filter(record)


@pytest.mark.slow
def test_client_that_vanishes_mid_stream_leaves_nothing(server, welcome):
    samples, _ = welcome
    before = server.metrics()["voxrt_audio_seconds_total"]
    ws = server.connect()
    stream(ws, samples[: 16000 * 5], final=False)
    # Mid stream: the server holds all 5 s and its engine works on them.
    wait_until(lambda: server.metrics()["voxrt_audio_seconds_total"] >= before + 5 - 1e-3, 30)
    wait_until(lambda: server.engine.stats().steps > 0 and server.engine.stats().utterances == 1, 30)
    with Bystander(server, samples):  # streaming while the other vanishes
        ws.socket.close()  # no close frame: the client just disappears
    metrics = wait_until_idle(server)
    assert metrics["voxrt_engine_utterances"] == 0
    assert metrics["voxrt_connections_active"] == 0
    assert metrics["voxrt_utterances_active"] == 0
    assert metrics["voxrt_encoder_cache_rows"] == 0
    assert server.engine.scheduler.requests == {}
    assert server.engine.scheduler.encoder_cache.input_ids_by_request == {}
    assert metrics["voxrt_feature_cache_bytes"] <= server.engine.feature_cache.capacity_bytes


@pytest.mark.slow
def test_sessions_that_come_and_go_leave_no_audio_behind(server, welcome):
    """Churn: sessions of distinct audio end one after another. What they referenced goes with
    them: live audio repeats too rarely for a cache of windows to pay, and one that kept them
    grew the server for as long as distinct sessions came."""
    samples, _ = welcome
    rng = np.random.default_rng(0)
    for _ in range(3):
        with server.connect() as ws:
            stream(ws, samples[: 16000 * 4] + rng.normal(0, 1e-3, 16000 * 4).astype(np.float32))
            events_until(ws, "transcription.done", timeout=120)
    metrics = wait_until_idle(server)
    assert metrics["voxrt_encoder_cache_rows"] == 0
    assert metrics["voxrt_encoder_cache_resident_rows"] == 0
    # The runner holds an item's log-mel only while it is referenced, or until the next step
    # that runs tells it the item went.
    cache = server.engine.scheduler.encoder_cache
    assert set(server.engine.runner.store) <= set(cache.refs) | set(cache.freed)


def test_client_that_stops_reading_is_closed(whisper_model, welcome):
    """A client that sends and never reads is closed, its seat freed, while a session streaming
    beside it gets its whole text."""
    # No event-rate limit: it would close this client before its unread events pile up.
    config = ServerConfig(limits=ConnectionLimits(outbox_events=8, max_events_per_second=1e9))
    harness = ServerThread(WhisperRunner(whisper_model), config)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing
        sock.connect(("127.0.0.1", harness.server.port))
        # Without compression: deflate shrank the server's identical error events to a few
        # bytes each, and filling its socket buffer took ~50 s. No keepalive: a client that
        # reads nothing never sees a pong, and would hang up itself after 40 s.
        ws = harness.connect(sock=sock, max_queue=1, compression=None, ping_interval=None)
        # Every bad message earns an error event the client never reads; once the socket
        # buffers and the outbox are full, the server gives up on it.
        junk = json.dumps({"type": "y" * 200})
        stop = threading.Event()

        def flood() -> None:
            with contextlib.suppress(ConnectionClosed, OSError):
                while not stop.is_set():
                    ws.send(junk)

        with Bystander(harness, welcome[0]):
            # From a thread: once the server stops reading, a send waits until the socket goes.
            flooding = threading.Thread(target=flood)
            flooding.start()
            wait_until(lambda: harness.metrics().get("voxrt_errors_total{code=slow_consumer}", 0) >= 1, 60)
            # Its seat is free before the kernel gives up on the socket the server left unread.
            wait_until(lambda: harness.metrics()["voxrt_connections_active"] == 1, 30)
        assert wait_until_idle(harness)["voxrt_connections_active"] == 0
        assert harness.metrics()["voxrt_errors_total{code=slow_consumer}"] == 1
        stop.set()
        ws.socket.shutdown(socket.SHUT_RDWR)  # wakes a send waiting on the full socket
        flooding.join(timeout=10)
        assert not flooding.is_alive()
    finally:
        harness.stop()


SENTENCES = [
    "The cat sat quietly by the warm fire.", "Please close the window before you leave.",
    "My grandmother grows tomatoes in her garden.", "The bus was late again this morning.",
    "We watched the stars from the top of the hill.", "He plays the piano every evening after dinner.",
    "The river runs through the middle of the town.", "She bought a red umbrella at the market.",
    "Our team won the football match on Saturday.", "The doctor will see you in ten minutes.",
    "Fresh bread is sold at the corner shop.", "They painted the fence white last summer.",
    "The museum is closed on Mondays.", "I left my keys on the kitchen table.",
    "The children built a castle out of sand.", "A strong wind blew the leaves across the road.",
    "Turn left at the church and walk two blocks.", "The coffee was too hot to drink.",
    "We need more paper for the printer.", "The old bridge was repaired in the spring.",
]  # fmt: skip


@pytest.mark.slow
def test_twenty_concurrent_sessions_each_get_their_own_text(server, tmp_path):
    """Different speech per session: one that read another's window would get the wrong words."""
    voices = ["en-us", "en+m3", "en-us+f2", "en+m7"]
    clips = [
        espeak(sentence, tmp_path / f"{i}.wav", voices[i % len(voices)])
        for i, sentence in enumerate(SENTENCES)
    ]
    results: dict[int, str] = {}

    def one(i: int) -> None:
        with server.connect() as ws:
            stream(ws, clips[i])
            results[i] = events_until(ws, "transcription.done", timeout=120)[-1]["text"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert len(results) == 20
    for i, text in results.items():
        own = word_error_rate(SENTENCES[i], text)
        assert own <= 0.5, (SENTENCES[i], text)
        assert all(own < word_error_rate(other, text) for other in SENTENCES if other != SENTENCES[i])
    assert wait_until_idle(server)["voxrt_encoder_cache_rows"] == 0


def test_health_and_metrics_endpoints(whisper_model, welcome):
    """One utterance on a fresh server: each figure says what happened, not only that it exists."""
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig())
    samples, _ = welcome
    try:
        status, body = harness.get("/health")
        health = json.loads(body)
        assert status == 200 and health["status"] == "ok" and health["model"] == "whisper-tiny.en"
        assert (health["connections"], health["utterances"]) == (0, 0)
        with harness.connect() as ws:
            stream(ws, samples)
            events = events_until(ws, "transcription.done")
        deltas = [e for e in events if e["type"] == "transcription.delta"]
        metrics = wait_until_idle(harness)
    finally:
        harness.stop()
    assert metrics["voxrt_connections_active"] == metrics["voxrt_utterances_active"] == 0
    assert metrics["voxrt_utterances_total"] == 1
    assert metrics["voxrt_audio_seconds_total"] == pytest.approx(len(samples) / 16000, abs=1e-3)
    assert metrics["voxrt_tokens_total"] >= events[-1]["usage"]["completion_tokens"] > 0
    assert metrics["voxrt_step_seconds_count"] >= 1 and metrics["voxrt_step_seconds_sum"] > 0
    assert metrics["voxrt_time_to_first_delta_seconds_count"] == 1
    assert metrics["voxrt_delta_latency_seconds_count"] == len(deltas) > 0
    assert metrics["voxrt_encoder_cache_rows"] == 0 < metrics["voxrt_encoder_cache_capacity_rows"]
    assert metrics["voxrt_feature_cache_queries_total"] > 0
    assert 0 <= metrics["voxrt_feature_cache_hits_total"] <= metrics["voxrt_feature_cache_queries_total"]
    assert metrics["process_resident_memory_bytes"] > 100 << 20


class EngineBug(BaseException):
    """What no `except Exception` catches: the engine thread dies of it."""


def kill_engine_thread(engine, monkeypatch) -> None:
    def die() -> None:
        raise EngineBug("a bug outside the step's error handling")

    monkeypatch.setattr(engine, "step", die)
    wait_until(lambda: not engine.alive, 10)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_engine_turns_health_unready(whisper_model, monkeypatch):
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig())
    try:
        assert harness.get("/health")[0] == 200
        kill_engine_thread(harness.engine, monkeypatch)
        for path in ("/health", "/health/live", "/health/ready"):
            assert health(harness, path) == (503, "engine_dead")
    finally:
        harness.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_engine_ends_serve_with_exit_status_1(whisper_model, monkeypatch):
    engine = Engine(WhisperRunner(whisper_model))
    server = RealtimeServer(engine, ServerConfig(port=0), ServedModel(name="whisper"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def serve_forever() -> int:
        return await server.serve(asyncio.Event())  # never set: only the engine's death ends it

    try:
        served = asyncio.run_coroutine_threadsafe(serve_forever(), loop)
        wait_until(lambda: server.port is not None, 30)
        kill_engine_thread(engine, monkeypatch)
        assert served.result(timeout=30) == 1
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def test_the_event_loop_answers_while_a_drain_waits_for_the_engine_thread(
    whisper_model, welcome, monkeypatch
):
    """Drain ends with a join of the engine thread (up to 30 s while a step finishes): the
    event loop goes on serving meanwhile."""
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(drain_seconds=0.2))
    gate, held = hold_steps(harness.engine, monkeypatch)
    joining, stop = threading.Event(), harness.engine.stop

    def observed_stop() -> None:
        joining.set()
        stop()

    monkeypatch.setattr(harness.engine, "stop", observed_stop)
    samples, _ = welcome
    try:
        with harness.connect() as ws:
            stream(ws, samples[: 16000 * 3], final=False)
            assert held.wait(30)
            drain = asyncio.run_coroutine_threadsafe(harness.server.drain_and_stop(), harness.loop)
            assert joining.wait(30)  # the drain is in its join, the engine thread held in a step
        # The loop answers now, not once the join ends (30 s, or the gate).
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), harness.loop).result(timeout=10)
        assert not drain.done()
        gate.set()
        drain.result(timeout=30)
        assert not harness.engine.alive
    finally:
        gate.set()
        harness.loop.call_soon_threadsafe(harness.loop.stop)


def test_a_commit_during_a_drain_starts_no_utterance(whisper_model, welcome, monkeypatch):
    """A drain ends every input. A vLLM client that commits once its utterance is done is told
    the server is draining, and is closed with 1001: no utterance starts to be cut unfinished."""
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(drain_seconds=30))
    samples, _ = welcome
    busy, client = harness.connect(), harness.connect()
    # An upload keeps the drain going: once only it is left in the engine, its steps wait
    # until the client's commit was answered.
    answered, submit = threading.Event(), harness.engine.runner.submit

    def submit_after_the_answer(out, states):
        left = harness.engine.utterances.values()
        if harness.server.draining and left and all(u.request.kind is RequestKind.UPLOAD for u in left):
            answered.wait()
        return submit(out, states)

    monkeypatch.setattr(harness.engine.runner, "submit", submit_after_the_answer)
    sdk = openai.OpenAI(base_url=f"{harness.http}/v1", api_key="unused", max_retries=0)
    wav = io.BytesIO()
    soundfile.write(wav, np.tile(samples, 8), 16000, format="WAV", subtype="PCM_16")
    uploaded = []
    upload = threading.Thread(
        target=lambda: uploaded.append(
            sdk.audio.transcriptions.create(file=("long.wav", wav.getvalue()), model="whisper-1")
        )
    )
    try:
        upload.start()
        stream(busy, np.tile(samples, 2), 16000, final=False)
        stream(client, samples[:16000], 16000, final=False)
        sent = 1 + 2 * len(samples) / 16000
        wait_until(lambda: harness.metrics()["voxrt_audio_seconds_total"] >= sent - 1e-3, 30)
        wait_until(lambda: harness.metrics()["voxrt_engine_utterances"] == 3, 30)  # the upload's too
        drain = asyncio.run_coroutine_threadsafe(harness.server.drain_and_stop(), harness.loop)
        events_until(client, "transcription.done")
        client.send(json.dumps({"type": "input_audio_buffer.commit"}))
        error = json.loads(client.recv(timeout=30))
        assert (error["type"], error["code"]) == ("error", "shutting_down"), error
        answered.set()
        with pytest.raises(ConnectionClosed) as closed:
            client.recv(timeout=60)
        assert closed.value.rcvd.code == 1001
        assert events_until(busy, "transcription.done")[-1]["usage"]["audio_seconds"] > 20
        drain.result(timeout=60)
        upload.join(timeout=60)
        assert uploaded and uploaded[0].text, "the upload the drain waited for is whole"
    finally:
        answered.set()
        harness.loop.call_soon_threadsafe(harness.loop.stop)


def test_delta_latency_counts_the_time_audio_waited_in_tcp(whisper_model, welcome, monkeypatch):
    """A real-time client whose audio the server stopped reading (backpressure, the engine
    held back): each delta's latency counts from when the client sent the audio, not from
    when the server got round to reading it."""
    samples, _ = welcome
    config = ServerConfig(limits=ConnectionLimits(max_buffered_seconds=0.5))
    harness = ServerThread(WhisperRunner(whisper_model), config)
    gate, _ = hold_steps(harness.engine, monkeypatch)
    chunk, aged = 1600, 2.0
    try:
        with harness.connect() as ws:
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            started = time.monotonic()
            for index, offset in enumerate(range(0, 16000 * 4, chunk)):  # paced as spoken
                time.sleep(max(0.0, started + index * chunk / 16000 - time.monotonic()))
                ws.send(append_event(samples[offset : offset + chunk]))
            time.sleep(aged)  # what the server did not read has now waited in TCP at least this long
            gate.set()
            text = ""
            while "everyone" not in text.lower():
                event = json.loads(ws.recv(timeout=60))
                assert event["type"] == "transcription.delta", event
                text += event["delta"]
            metrics = harness.metrics()
    finally:
        gate.set()
        harness.stop()
    assert metrics["voxrt_delta_latency_seconds_count"] > 0
    assert metrics["voxrt_delta_latency_seconds_bucket{le=1.0}"] == 0, "a delta's latency left out TCP time"
