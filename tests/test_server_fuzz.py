"""Random and mutated client messages against a live server, with a well-behaved session alongside."""

import base64
import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.text import word_error_rate
from realtime.config import ServerConfig
from tests.server_harness import ServerThread, append_event, events_until
from voxtral.whisper.runner import WhisperRunner

SERVER_EVENTS = {"session.created", "transcription.delta", "transcription.done", "error"}
SENTINEL = json.dumps({"type": "fuzz.sentinel"})

# Text as JSON carries it, lone surrogates included: the wire must refuse what is no Unicode.
texts = st.text(max_size=20) | st.sampled_from(["\ud800", "a\udfffb", "\x00\x1b", "x" * 5000])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
event_types = st.sampled_from(
    ["input_audio_buffer.append", "input_audio_buffer.commit", "session.update", "response.create", ""]
)
shaped_events = st.builds(
    lambda kind, extra: {"type": kind, **extra},
    event_types,
    st.dictionaries(
        st.sampled_from(["audio", "final", "model", "prompt", "language", "task", "word_timestamps", "x"]),
        json_values | st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()),
        max_size=3,
    ),
)
valid = st.sampled_from(
    [
        json.dumps(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x00" * 800).decode()}
        ),
        json.dumps({"type": "input_audio_buffer.commit"}),
        json.dumps({"type": "input_audio_buffer.commit", "final": True}),
        json.dumps({"type": "session.update", "model": "whisper-tiny.en"}),
    ]
)


@st.composite
def mutated(draw) -> str:
    text = draw(valid)
    position = draw(st.integers(0, len(text)))
    action = draw(st.sampled_from(["cut", "insert", "replace"]))
    junk = draw(st.text(max_size=5))
    if action == "cut":
        return text[:position]
    if action == "insert":
        return text[:position] + junk + text[position:]
    return text[:position] + junk + text[position + len(junk) :]


messages = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    json_values.map(json.dumps),
    shaped_events.map(json.dumps),
    mutated(),
    valid,
)


def check_event(raw: str) -> dict:
    event = json.loads(raw)
    assert isinstance(event, dict) and event.get("type") in SERVER_EVENTS, event
    if event["type"] == "error":
        assert isinstance(event["error"], str) and isinstance(event["code"], str)
    if event["type"] == "transcription.delta":
        assert isinstance(event["delta"], str)
    return event


@pytest.mark.slow
def test_fuzzed_messages_never_break_the_server(whisper_model, welcome):
    samples, text = welcome
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(max_frame_bytes=64_000))
    transcript: list[str] = []

    def well_behaved() -> None:
        with harness.connect() as ws:
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            for offset in range(0, len(samples), 3200):
                ws.send(append_event(samples[offset : offset + 3200]))
            ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
            transcript.append(events_until(ws, "transcription.done", timeout=300)[-1]["text"])

    neighbour = threading.Thread(target=well_behaved)
    neighbour.start()
    fuzz_ws = harness.connect()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(messages)
    def throw(message):
        fuzz_ws.send(message)
        fuzz_ws.send(SENTINEL)
        while True:
            event = check_event(fuzz_ws.recv(timeout=30))
            if event["type"] == "error" and "fuzz.sentinel" in event["error"]:
                return

    try:
        throw()
        assert harness.get("/health")[0] == 200
        neighbour.join(timeout=300)
        assert transcript and word_error_rate(text, transcript[0]) <= 0.1, transcript
    finally:
        fuzz_ws.close()
        harness.stop()
