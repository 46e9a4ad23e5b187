"""Walls at the server: what one client sends or suffers reaches no other session, every error
path survives the failure it meets, and every seat, slot and cache row of the dead comes back."""

import asyncio
import json
import socket
import struct
import subprocess
import sys
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from realtime.config import ConfigError, ServerConfig
from realtime.engine.loop import Engine
from realtime.limits import ConnectionLimits
from realtime.protocols.common import MAX_PROMPT_CHARS
from realtime.server import RealtimeServer
from tests.server_harness import (
    TINY_EN,
    Bystander,
    ServerThread,
    append_event,
    events_until,
    expect_error,
    hold_steps,
    http_get,
    stream,
    wait_until,
)
from voxtral.whisper.runner import WhisperRunner

OPENAI_QUERY = "?intent=transcription"
# Legal JSON whose string is no text: a lone surrogate, as the attack sends it.
SURROGATE = "\\ud800"
GAUGES = (
    "voxrt_utterances_active",
    "voxrt_encoder_cache_rows",
    "voxrt_kv_slots_used",
    "voxrt_engine_utterances",
)


def gauges(harness: ServerThread) -> dict[str, float]:
    metrics = harness.metrics()
    return {name: metrics[name] for name in GAUGES}


def hostile(event: dict) -> str:
    """`event` as JSON, with each "@" a lone surrogate's escape."""
    return json.dumps(event).replace("@", SURROGATE)


COMMIT = json.dumps({"type": "input_audio_buffer.commit"})
OPENAI_PROMPT = {"type": "transcription", "audio": {"input": {"transcription": {"prompt": "@"}}}}
ATTACKS = {  # (URL query, events; None: a second of audio)
    "vllm": ("", [hostile({"type": "session.update", "prompt": "@ hello"}), COMMIT]),
    "openai": (OPENAI_QUERY, [hostile({"type": "session.update", "session": OPENAI_PROMPT}), None, COMMIT]),
}


@pytest.mark.parametrize("wire", list(ATTACKS))
def test_a_lone_surrogate_prompt_ends_no_other_session(whisper_model, welcome, wire, monkeypatch):
    """The attack lands while the bystander's audio waits in the engine's queue (steps held):
    with today's walls the bystander's text is as if it were alone."""
    samples, _ = welcome
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(), max_sessions=4)
    before = gauges(harness)
    gate, _ = hold_steps(harness.engine, monkeypatch)
    query, events = ATTACKS[wire]
    try:
        with (
            Bystander(harness, samples),
            connect(harness.url + query, open_timeout=10) as attacker,
        ):
            attacker.recv(timeout=10)  # created
            for event in events:
                attacker.send(event if event is not None else append_event(samples[:16000]))
            gate.set()
            refused = json.loads(attacker.recv(timeout=30))
            assert refused["type"] == "error" and "Unicode" in json.dumps(refused), refused
        wait_until(lambda: gauges(harness) == before, 60)
        assert harness.get("/health/ready")[0] == 200
    finally:
        gate.set()
        harness.stop()


@pytest.fixture(scope="module")
def server(whisper_model):
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(), max_sessions=8)
    yield harness
    harness.stop()


@pytest.mark.parametrize("query", ["", OPENAI_QUERY])
def test_strings_that_are_not_text_are_refused_without_echo_and_the_connection_goes_on(
    server, welcome, query
):
    with Bystander(server, welcome[0]), connect(server.url + query, open_timeout=10) as ws:
        ws.recv(timeout=10)
        for raw in (
            hostile({"type": "@"}),
            hostile({"type": "session.update", "@": 1}),
            hostile({"type": "session.update", "x": [{"y": "@"}]}),
        ):
            ws.send(raw)
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "error", event
            assert "Unicode" in json.dumps(event) and "\ud800" not in json.dumps(event, ensure_ascii=False)
        ws.send(json.dumps({"type": "nope"}))  # the connection still answers
        assert "nope" in json.dumps(json.loads(ws.recv(timeout=10)))


def test_a_prompt_past_its_bound_is_refused_and_one_within_it_is_taken(server, welcome):
    with Bystander(server, welcome[0]), server.connect() as ws:
        long = {"type": "session.update", "prompt": "word " * (MAX_PROMPT_CHARS // 5 + 1)}
        event = expect_error(ws, json.dumps(long), "invalid_event")
        assert "prompt" in event["error"] and str(MAX_PROMPT_CHARS) in event["error"]
        ws.send(json.dumps({"type": "session.update", "prompt": "word " * (MAX_PROMPT_CHARS // 5)}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        events = events_until(ws, "transcription.done", timeout=60)
        assert [e for e in events if e["type"] == "error"] == [], events


def test_a_connection_holds_at_most_its_utterances_and_admission_counts_them(
    whisper_model, welcome, monkeypatch
):
    """OpenAI's manual commits each end an utterance whose text is still owed: past
    `max_utterances` the next is refused, and each held one is a seat."""
    samples, _ = welcome
    config = ServerConfig(limits=ConnectionLimits(max_utterances=2))
    harness = ServerThread(WhisperRunner(whisper_model), config, max_sessions=8)
    gate, _ = hold_steps(harness.engine, monkeypatch)
    try:
        with (
            Bystander(harness, samples),
            connect(harness.url + OPENAI_QUERY, open_timeout=10) as ws,
        ):
            ws.recv(timeout=10)
            ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "transcription",
                            "audio": {
                                "input": {
                                    "turn_detection": None,
                                    "format": {"type": "audio/pcm", "rate": 16000},
                                }
                            },
                        },
                    }
                )
            )
            assert json.loads(ws.recv(timeout=10))["type"] == "session.updated"
            kinds = []
            for _ in range(3):
                ws.send(append_event(samples[:16000]))
                ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            ws.send(json.dumps({"type": "session.update"}))  # a marker: everything before it answered
            while (event := json.loads(ws.recv(timeout=10)))["type"] != "session.updated":
                kinds.append(event.get("error", {}).get("code") or event["type"])
            assert kinds.count("too_many_utterances") == 1, kinds
            assert harness.server.admission.seats()[0] == 2 + 1  # and the bystander's seat
            gate.set()
            completed = 0
            while completed < 2:
                event = json.loads(ws.recv(timeout=60))
                completed += event["type"] == "conversation.item.input_audio_transcription.completed"
        wait_until(lambda: harness.metrics()["voxrt_utterances_active"] == 0, 60)
    finally:
        gate.set()
        harness.stop()


def test_an_event_that_cannot_be_sent_closes_its_connection_alone(server, welcome):
    samples, _ = welcome
    before = gauges(server)
    with Bystander(server, samples) as bystander, server.connect() as victim:
        stream(victim, samples[: 16000 * 2], final=False)
        wait_until(lambda: server.metrics()["voxrt_utterances_active"] >= 1, 30)
        connection = max(server.server.connections, key=lambda c: c.started_at)  # the victim's
        server.loop.call_soon_threadsafe(connection.send, "\ud800")
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                victim.recv(timeout=30)
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1011, "internal_error")
    assert "morning" in bystander.text().lower()
    wait_until(lambda: gauges(server) == before, 60)


def test_the_admission_watcher_survives_a_check_that_raises_and_a_shed_whose_sender_died(server):
    with server.connect():
        wait_until(lambda: len(server.server.connections) == 1, 10)
        (connection,) = server.server.connections
        calls = {"n": 0}

        def lag_raising_once(now):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("injected fault")
            return 0.0

        connection.seats.lag_seconds = lag_raising_once
        wait_until(lambda: calls["n"] >= 2, 10)  # the watcher checked again after the fault
        assert not server.server.watcher.done()
        server.loop.call_soon_threadsafe(connection.send, "\ud800")  # its sender dies
        wait_until(lambda: connection.outbox.sender.done(), 10)
        shed = asyncio.run_coroutine_threadsafe(
            connection.close(1013, "server_overloaded", "shed"), server.loop
        )
        shed.result(timeout=30)  # returns, and raises nothing


def test_a_handler_paused_by_backpressure_notices_its_socket_closed(whisper_model, welcome, monkeypatch):
    samples, _ = welcome
    config = ServerConfig(limits=ConnectionLimits(max_buffered_seconds=1.0))
    harness = ServerThread(WhisperRunner(whisper_model), config)
    gate, held = hold_steps(harness.engine, monkeypatch)
    try:
        sock = socket.create_connection(("127.0.0.1", harness.server.port))
        with harness.connect(sock=sock) as ws:
            stream(ws, samples[: 16000 * 3], final=False)  # reads pause past 1 s unconsumed
            assert held.wait(30)
            assert len(harness.server.connections) == 1
            # The socket goes at once (a reset, as a crashed client's), no close frame.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            wait_until(lambda: not harness.server.connections, 30)  # the engine is still held
            assert harness.metrics()["voxrt_utterances_active"] == 0
        # A client streaming into the server the vanished one left behind, the engine still
        # held: once it steps again, this one gets its text.
        with Bystander(harness, samples):
            gate.set()
    finally:
        gate.set()
        harness.stop()


# A client that connects, starts an utterance, then stops (SIGSTOP): it answers no close frame.
STOPPED_CLIENT = """
import json, os, signal, sys
from websockets.sync.client import connect
ws = connect(sys.argv[1])
ws.recv()
ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_drain_with_peers_that_never_answer_ends_within_its_seconds_and_refuses_probes(whisper_model):
    drain_seconds = 1.0
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(drain_seconds=drain_seconds))
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", STOPPED_CLIENT, harness.url], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    try:
        for client in clients:
            assert client.stdout.readline().strip() == "ready"
        wait_until(lambda: len(harness.server.connections) == 3, 30)
        started = time.monotonic()
        drain = asyncio.run_coroutine_threadsafe(harness.server.drain_and_stop(), harness.loop)
        wait_until(lambda: harness.server.draining and not harness.server.accepting(), 10)
        with pytest.raises(OSError):  # the port no longer accepts: a probe reads not ready
            http_get(harness.http + "/health/ready")
        drain.result(timeout=120)
        # Each close waits `CLOSE_SECONDS` for its peer at most, all at once: far less than
        # websockets' 10 s close timeout paid once per silent peer.
        assert time.monotonic() - started < drain_seconds + 10
        assert not harness.server.connections
    finally:
        for client in clients:
            client.kill()
        harness.loop.call_soon_threadsafe(harness.loop.stop)


def test_an_empty_api_key_refuses_to_start_and_an_empty_offered_key_never_matches(whisper_model):
    runner = WhisperRunner(whisper_model)
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match="empty"):
            RealtimeServer(Engine(runner), ServerConfig(api_key=empty), TINY_EN)
    harness = ServerThread(runner, ServerConfig(api_key="sk-test"))
    try:
        for offered in ("openai-insecure-api-key.", "openai-insecure-api-key., realtime"):
            with pytest.raises(Exception, match="401"):
                connect(harness.url, subprotocols=[p.strip() for p in offered.split(",")], open_timeout=10)
        with connect(
            harness.url, subprotocols=["openai-insecure-api-key.sk-test", "realtime"], open_timeout=10
        ):
            pass
    finally:
        harness.stop()
