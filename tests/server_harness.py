"""A real voxrt server on 127.0.0.1 (ephemeral port) in a background thread, for end-to-end tests."""

import asyncio
import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import ClientConnection, connect

from benchmarks.text import word_error_rate
from clients.audio import float32_to_pcm16
from realtime.config import ServedModel, ServerConfig
from realtime.engine.capacity import CapacityConfig
from realtime.engine.config import EngineConfig
from realtime.engine.loop import Engine
from realtime.server import RealtimeServer

# The first sentence of clients/samples/welcome.wav, all said in its first WELCOME_SECONDS.
WELCOME_SECONDS = 4
WELCOME_WORDS = "Good morning everyone. Today we will talk about the weather in the city."
TINY_EN = ServedModel(name="whisper-tiny.en", names=frozenset({"whisper-tiny.en", "whisper"}))


def unmeasured(**engine_settings) -> EngineConfig:
    """An engine whose sessions only --max-sessions caps. Measured capacity would refuse the
    many idle connections these tests open on 2 cores, or every session past the first on a
    machine that something else keeps busy, and shedding would end their deliberately
    overloaded sessions (tests/test_capacity.py tests admission and shedding)."""
    return EngineConfig(capacity=CapacityConfig(target_busy=100, max_lag_seconds=3600), **engine_settings)


class ServerThread:
    def __init__(
        self,
        runner,
        config: ServerConfig,
        engine_config: EngineConfig | None = None,
        model: ServedModel = TINY_EN,
        max_sessions: int = 64,
    ):
        config.port = 0
        self.engine = Engine(runner, engine_config or unmeasured(max_sessions=max_sessions))
        self.server = RealtimeServer(self.engine, config, model)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout=30)
        self.url = f"ws://127.0.0.1:{self.server.port}/v1/realtime"
        self.http = f"http://127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.drain_and_stop(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def connect(self, **kwargs) -> ClientConnection:
        return open_session(self.url, **kwargs)

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(self.http + path, timeout=10) as response:
            return response.status, response.read().decode()

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, parsed with Prometheus' own text parser."""
        _, text = self.get("/metrics")
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return values


def open_session(url: str, **kwargs) -> ClientConnection:
    """A connection to the realtime endpoint at `url`, its `session.created` read."""
    connection = connect(url, open_timeout=10, **kwargs)
    created = json.loads(connection.recv(timeout=10))
    assert created["type"] == "session.created" and created["id"].startswith("sess-")
    assert isinstance(created["created"], int)
    return connection


def hold_steps(engine: Engine, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """(gate, held): the engine's steps wait at submission until `gate` is set; `held` is set
    once one waits."""
    gate, held, submit = threading.Event(), threading.Event(), engine.runner.submit

    def held_submit(out, states):
        held.set()
        gate.wait()
        return submit(out, states)

    monkeypatch.setattr(engine.runner, "submit", held_submit)
    return gate, held


def append_event(samples: np.ndarray) -> str:
    return json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(float32_to_pcm16(samples)).decode()}
    )


def stream(connection: ClientConnection, samples: np.ndarray, chunk: int = 3200, final: bool = True) -> None:
    connection.send(json.dumps({"type": "input_audio_buffer.commit"}))
    for offset in range(0, len(samples), chunk):
        connection.send(append_event(samples[offset : offset + chunk]))
    if final:
        connection.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))


def events_until(connection: ClientConnection, kind: str, timeout: float = 60) -> list[dict]:
    """Events up to and including the first of type `kind` (or an error if kind is 'error')."""
    events = []
    while True:
        event = json.loads(connection.recv(timeout=timeout))
        events.append(event)
        if event["type"] == kind:
            return events


def expect_error(connection: ClientConnection, message: str | bytes, code: str) -> dict:
    connection.send(message)
    event = json.loads(connection.recv(timeout=10))
    assert event["type"] == "error" and event["code"] == code, event
    assert isinstance(event["error"], str) and event["error"]
    return event


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str) -> tuple[int, str]:
    """(status, body), 4xx and 5xx included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(port: int, name: str) -> float:
    """A metric of the server on `port`, summed over its labels."""
    _, text = http_get(f"http://127.0.0.1:{port}/metrics")
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def resident_mb(pid: int) -> float:
    """Process `pid`'s resident memory now, in MB."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


class ResidentMemory:
    """A process's resident memory, sampled on a thread until stopped: the peak between reads
    of a running server, not what this test process holds."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[float] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stopped.wait(0.02):
            self.samples.append(resident_mb(self.pid))

    def stop(self) -> list[float]:
        self.stopped.set()
        self.thread.join()
        return self.samples


def wait_until(ready, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(OSError):
            if ready():
                return
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.2)


class ServerProcess:
    """`voxrt serve` as its own process on a free port, as an operator runs it; ready once
    `/health/ready` says so."""

    def __init__(
        self,
        *flags: str,
        log_path=None,
        wait: bool = True,
        checkout: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`checkout`: another build's tree, served by its own virtual environment (default: this one)."""
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}/v1/realtime"
        self.log = open(log_path, "w") if log_path else None  # noqa: SIM115 - the process holds it
        python = str(checkout / ".venv/bin/python") if checkout else sys.executable
        self.process = subprocess.Popen(
            [python, "-m", "realtime.cli", "serve", f"--port={self.port}", "--log-level=warning", *flags],
            cwd=checkout or Path(__file__).resolve().parent.parent,
            stderr=self.log,
            env={**os.environ, **(env or {})},
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        wait_until(self._ready, 180)

    def _ready(self) -> bool:
        assert self.process.poll() is None, "voxrt serve exited while starting"
        return self.get("/health/ready")[0] == 200

    def get(self, path: str) -> tuple[int, str]:
        return http_get(f"http://127.0.0.1:{self.port}{path}")

    def connect(self, **kwargs) -> ClientConnection:
        return open_session(self.url, **kwargs)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        code = self.process.wait(timeout=60)
        if self.log is not None:
            self.log.close()
        return code


@contextlib.contextmanager
def streaming_beside(ws: ClientConnection, samples: np.ndarray) -> Iterator[None]:
    """A session on `ws` streams half its audio before the block and half after, and must
    then get its text: what the block's clients did never reached it."""
    half = len(samples) // 2
    stream(ws, samples[:half], 1600, final=False)
    yield
    stream(ws, samples[half:], 1600)  # its commit finds the utterance running: it goes on
    text = events_until(ws, "transcription.done", timeout=120)[-1]["text"]
    assert word_error_rate(WELCOME_WORDS, text) <= 0.2, text


class Bystander(threading.Thread):
    """A client streaming the first sentence of the welcome sample (`WELCOME_WORDS`) on the vLLM
    wire: its events, until done or an error."""

    def __init__(self, harness: "ServerThread | ServerProcess", welcome_audio: np.ndarray) -> None:
        super().__init__()
        self.harness, self.samples = harness, welcome_audio[: 16000 * WELCOME_SECONDS]
        self.events: list[dict] = []
        self.streamed = threading.Event()

    def run(self) -> None:
        with self.harness.connect() as ws:
            stream(ws, self.samples)
            self.streamed.set()
            while not self.events or self.events[-1]["type"] not in ("transcription.done", "error"):
                self.events.append(json.loads(ws.recv(timeout=120)))

    def text(self) -> str:
        assert self.events[-1]["type"] == "transcription.done", self.events[-1]
        return self.events[-1]["text"]

    def __enter__(self) -> "Bystander":
        """Streaming beside the block; its audio is all sent when the block starts."""
        self.start()
        assert self.streamed.wait(60)
        return self

    def __exit__(self, kind, *_) -> None:
        """Once the block is done: the bystander's text as it would be alone."""
        self.join(timeout=120)
        if kind is None:
            assert word_error_rate(WELCOME_WORDS, self.text()) <= 0.2, self.text()
            assert not any(e["type"] == "error" for e in self.events)
