"""`voxrt serve` as a subprocess: startup log, SIGTERM drain, exit code."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from tests.conftest import ROOT
from tests.server_harness import events_until, http_get, open_session, stream, wait_until
from voxtral.loading import served_cpu_weights


def start_server(*extra: str, model: str = "whisper-tiny.en") -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "realtime.cli", "serve", "--port", "0", "--threads", "2", *extra],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("event") == "server.listening":
            assert record["model"] == model and record["device"] == "cpu"
            # Whisper's by this CPU (the default), Voxtral's float32 (the CPU's default dtype).
            assert record["precision"] == (served_cpu_weights() if "whisper" in model else "float32")
            return process, record["url"]
    process.kill()
    pytest.fail("server did not start")


@pytest.mark.slow
def test_sigterm_drains_utterances_and_exits_zero(welcome):
    samples, _ = welcome
    process, url = start_server("--drain-seconds", "300")
    try:
        with open_session(url) as ws:
            stream(ws, samples[: 16000 * 4], final=False)
            # Signal once the server holds all 4 s of audio: the drain must transcribe it all.
            metrics_url = url.replace("ws://", "http://").replace("/v1/realtime", "/metrics")
            deadline = time.monotonic() + 30
            while "voxrt_audio_seconds_total 4.0" not in urllib.request.urlopen(metrics_url).read().decode():
                assert time.monotonic() < deadline, "the server never received the audio"
                time.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            done = events_until(ws, "transcription.done", timeout=60)[-1]
            assert "morning" in done["text"].lower()
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd.code == 1001
        assert process.wait(timeout=60) == 0
        logs = [json.loads(line) for line in process.stderr.read().splitlines() if line.startswith("{")]
        events = [record["event"] for record in logs]
        assert "server.draining" in events and "server.stopped" in events
        ends = [r for r in logs if r["event"] == "connection.close"]
        assert ends and ends[0]["connection_id"].startswith("sess-") and ends[0]["audio_seconds"] == 4.0
    finally:
        process.kill()


@pytest.mark.slow
def test_sigint_drains_too_and_what_it_cannot_finish_in_its_seconds_is_closed_with_1001(welcome):
    """Ctrl-C drains as SIGTERM does. An utterance the drain cannot finish within
    `--drain-seconds` is closed with 1001, its text owed no longer, and the server exits 0."""
    samples, _ = welcome
    process, url = start_server("--drain-seconds", "0.5")
    try:
        with open_session(url) as ws:
            stream(ws, np.tile(samples, 6), 16000, final=False)  # a minute to transcribe
            metrics_url = url.replace("ws://", "http://").replace("/v1/realtime", "/metrics")
            wait_until(lambda: "voxrt_utterances_active 1.0" in http_get(metrics_url)[1], 60)
            process.send_signal(signal.SIGINT)
            events = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    events.append(json.loads(ws.recv(timeout=60))["type"])
            assert closed.value.rcvd.code == 1001 and "transcription.done" not in events
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()


def test_a_port_another_process_holds_stops_it_with_exit_2_and_the_address():
    """Taken before the engine starts: an operator reads the address, not a traceback."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        refused = subprocess.run(
            [sys.executable, "-m", "realtime.cli", "serve", "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert refused.returncode == 2, refused.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in refused.stderr and "Traceback" not in refused.stderr
