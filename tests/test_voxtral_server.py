"""`voxrt serve --model <Voxtral checkpoint>` as a subprocess, over a real socket."""

import json
import socket
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from tests.server_harness import append_event, events_until, open_session, wait_until
from tests.test_server_process import start_server
from tests.voxtral_harness import pcm16_grid, pieces, reference_text, reference_tokens


def metrics(url: str) -> dict[str, float]:
    http = url.replace("ws://", "http://").removesuffix("/v1/realtime")
    with urllib.request.urlopen(http + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


@pytest.mark.slow
def test_a_client_gets_generates_transcript_and_a_vanished_one_leaves_nothing(voxtral_dirs, welcome):
    path = voxtral_dirs["base"]
    audio = pcm16_grid(welcome[0][: 16_000 * 3])
    expected = reference_text(path, reference_tokens(path, audio))
    process, url = start_server("--model", str(path), "--max-sessions", "4", model=str(path))
    try:
        # A client that vanishes mid-stream: socket closed, no close frame.
        vanishing = connect(url, open_timeout=10)
        vanishing.recv(timeout=10)
        vanishing.send(append_event(pcm16_grid(np.random.default_rng(0).normal(0, 0.1, 16_000))))
        wait_until(lambda: metrics(url)["voxrt_kv_slots_used"] == 1, 30)  # its utterance holds a slot
        vanishing.socket.shutdown(socket.SHUT_RDWR)
        vanishing.socket.close()

        with open_session(url) as ws:
            ws.send(json.dumps({"type": "session.update", "model": "voxtral", "word_timestamps": True}))
            refused = events_until(ws, "error")[-1]  # its tokens are not timed words
            assert refused["code"] == "unsupported_option", refused
            ws.send(json.dumps({"type": "session.update", "diarize": True}))  # nor speakers, then
            refused = events_until(ws, "error")[-1]
            assert refused["code"] == "unsupported_option" and "speaker" in refused["error"], refused
            ws.send(json.dumps({"type": "session.update", "model": "voxtral"}))
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            for piece in pieces(audio, "random", seed=5):
                ws.send(append_event(piece))
            ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
            events = events_until(ws, "transcription.done", timeout=60)
        deltas = [e["delta"] for e in events if e["type"] == "transcription.delta"]
        assert len(deltas) >= 3 and "".join(deltas) == events[-1]["text"] == expected
        assert events[-1]["usage"]["completion_tokens"] == len(reference_tokens(path, audio))

        deadline = time.monotonic() + 30
        # The stats snapshot follows within a step.
        held = ("voxrt_engine_utterances", "voxrt_kv_slots_used")
        while any((figures := metrics(url))[name] for name in held) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert figures["voxrt_engine_utterances"] == 0
        assert figures["voxrt_kv_slots_used"] == 0
        assert figures["voxrt_encoder_cache_rows"] == 0 and figures["voxrt_encoder_cache_resident_rows"] == 0
    finally:
        process.terminate()
        process.wait(timeout=30)
