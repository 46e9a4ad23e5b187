"""Hostile values in every field of every client event, on every wire (Deepgram's query too,
and its frames in any order), while bystanders on all three wires stream real speech: each
bystander's text is exactly its text alone (Voxtral's tokens do not depend on their neighbours
in a batch), the server stays ready, and no connection but an attacker's is closed, never with
1006 or 1011."""

import base64
import json
import threading
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from realtime.config import ServedModel, ServerConfig
from realtime.limits import ConnectionLimits
from tests.server_harness import ServerThread, events_until, stream, wait_until
from voxtral.loading import load_model

OPENAI = "?intent=transcription"
SENTINEL = json.dumps({"type": "fuzz.sentinel"})
# What a server may close an attacker with: a reason of its own, never an abnormal closure.
FAIR_CLOSES = {1000, 1008, 1009, 1013}

strings = st.one_of(
    st.sampled_from(
        ["\ud800", "a\udfffb", "\x00", "\x07\x1b[31m\r\n", "", "\u202e", "en", "translate", "x" * (1 << 20)]
    ),
    st.text(max_size=12),
)
numbers = st.one_of(
    st.sampled_from([0, -1, 2**63, -(2**63), 10**40, 1e308, -1e308, 16000, 24000]), st.integers()
)
scalars = st.one_of(st.none(), st.booleans(), numbers, strings)
junk = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(strings, c, max_size=3), max_leaves=6
)
audio = st.binary(max_size=3200).map(lambda b: base64.b64encode(b).decode())
values = st.one_of(scalars, junk, audio)


def shaped(**fields) -> st.SearchStrategy[dict]:
    """A dict with any of `fields`, each a hostile value or its own shape, plus an unknown one."""
    return st.fixed_dictionaries({}, optional={**fields, "unknown": values})


def either(shape: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(shape, values)


VLLM_TYPES = ["session.update", "input_audio_buffer.append", "input_audio_buffer.commit"]
vllm_events = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(VLLM_TYPES) | strings,
    shaped(
        model=values,
        interim=values,
        language=values,
        task=values,
        prompt=values,
        word_timestamps=values,
        diarize=values,
        keyterms=values,
        audio=values,
        final=values,
    ),
)
vad = shaped(type=values, threshold=values, prefix_padding_ms=values, silence_duration_ms=values)
transcription = shaped(model=values, language=values, prompt=values, keyterms=values)
audio_input = shaped(
    format=either(shaped(type=values, rate=values)),
    transcription=either(transcription),
    turn_detection=either(vad),
)
session = shaped(
    type=values,
    audio=either(shaped(input=either(audio_input))),
    include=values,
    input_audio_format=values,
    input_audio_transcription=either(transcription),
    turn_detection=either(vad),
)
OPENAI_TYPES = [
    "session.update",
    "transcription_session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
]
openai_events = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(OPENAI_TYPES) | strings,
    shaped(event_id=values, session=either(session), audio=values),
)


# Deepgram's wire: its control messages and audio frames in any order, and hostile queries.
DEEPGRAM = "/v1/listen?encoding=linear16&sample_rate=16000"
DEEPGRAM_TYPES = ["KeepAlive", "Finalize", "CloseStream"]
deepgram_frames = st.one_of(
    st.builds(
        lambda kind, fields: {"type": kind, **fields}, st.sampled_from(DEEPGRAM_TYPES) | strings, shaped()
    ),
    st.binary(max_size=3200),
    strings.filter(lambda text: text.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == text),
    junk.map(json.dumps),
)  # a text frame is UTF-8: a lone surrogate cannot be sent in one (json.dumps escapes it)
QUERY_NAMES = [
    "encoding", "sample_rate", "channels", "multichannel", "interim_results", "endpointing",
    "utterance_end_ms", "vad_events", "diarize", "diarize_model", "keyterm", "keywords", "language",
    "model", "punctuate", "tag",
]  # fmt: skip
hostile = st.dictionaries(
    st.sampled_from(QUERY_NAMES) | st.text(max_size=8), strings | numbers.map(str), max_size=6
)
# Half of them with a valid coding, so that the rest of the query is read and served.
queries = hostile | hostile.map(lambda q: {**q, "encoding": "linear16", "sample_rate": "16000"})


def vllm_text(harness: ServerThread, samples) -> str:
    with harness.connect() as ws:
        stream(ws, samples, chunk=1280)
        return events_until(ws, "transcription.done", timeout=120)[-1]["text"]


def openai_text(harness: ServerThread, samples) -> str:
    """One manually committed item at 16 kHz: its completed transcript."""
    with connect(harness.url + OPENAI, open_timeout=10) as ws:
        ws.recv(timeout=10)
        input_ = {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}
        ws.send(
            json.dumps(
                {"type": "session.update", "session": {"type": "transcription", "audio": {"input": input_}}}
            )
        )
        for offset in range(0, len(samples), 1280):
            chunk = (samples[offset : offset + 1280] * 32767).astype("<i2").tobytes()
            ws.send(
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
            )
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        return events_until(ws, "conversation.item.input_audio_transcription.completed", timeout=120)[-1][
            "transcript"
        ]


def deepgram_text(harness: ServerThread, samples) -> str:
    """Binary PCM16 frames, then CloseStream: its final results' text, without the spaces
    between results (a result holds a delta, which may end inside a word)."""
    url = harness.url.removesuffix("/v1/realtime") + DEEPGRAM
    with connect(url, open_timeout=10) as ws:
        for offset in range(0, len(samples), 1280):
            ws.send((samples[offset : offset + 1280] * 32767).astype("<i2").tobytes())
        ws.send(json.dumps({"type": "CloseStream"}))
        texts = []
        while (message := json.loads(ws.recv(timeout=120)))["type"] != "Metadata":
            if message["type"] == "Results" and message["is_final"]:
                texts.append(message["channel"]["alternatives"][0]["transcript"])
    return "".join("".join(texts).split())


BYSTANDERS = {"vllm": vllm_text, "openai": openai_text, "deepgram": deepgram_text}


class Attacker:
    """A connection on one wire that sends what it is given; reconnects when the server closes
    it, and keeps the codes it was closed with."""

    def __init__(self, harness: ServerThread, path: str) -> None:
        self.url = harness.url.removesuffix("/v1/realtime") + path
        self.greets = not path.startswith("/v1/listen")  # Deepgram says nothing at first
        self.closes: list[int | None] = []
        self.ws = self._connect()

    def _connect(self) -> ClientConnection:
        ws = connect(self.url, open_timeout=10, max_size=None)
        if self.greets:
            ws.recv(timeout=10)  # created
        return ws

    def throw(self, events: list[dict | str | bytes]) -> None:
        """The events, then a sentinel (an unknown type): every answer up to its error is read."""
        try:
            for event in events:
                self.ws.send(event if isinstance(event, str | bytes) else json.dumps(event))
            self.ws.send(SENTINEL)
            while "fuzz.sentinel" not in self.ws.recv(timeout=60):
                pass
        except ConnectionClosed as closed:
            self.closes.append(closed.rcvd.code if closed.rcvd else None)
            self.ws = self._connect()


@pytest.fixture(scope="module")
def voxtral_server(voxtral_dirs):
    loaded = load_model(str(voxtral_dirs["base"]), "cpu", "float32", max_sessions=8)
    config = ServerConfig(max_frame_bytes=4 << 20, limits=ConnectionLimits(max_events_per_second=10_000))
    served = ServedModel(name=loaded.label, names=frozenset(loaded.names))
    harness = ServerThread(loaded.runner, config, model=served, max_sessions=8)
    yield harness
    harness.stop()


ATTACKS = {
    "vllm": ("/v1/realtime", vllm_events),
    "openai": ("/v1/realtime" + OPENAI, openai_events),
    "deepgram": (DEEPGRAM, deepgram_frames),
}


def hostile_queries(harness: ServerThread) -> None:
    """Upgrades with hostile queries on Deepgram's wire: each refused (400) or served, and a
    served one closes cleanly."""
    base = harness.url.removesuffix("/v1/realtime") + "/v1/listen"

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(queries)
    def upgrade(query):
        url = base + "?" + urlencode(query, errors="surrogatepass")
        try:
            with connect(url, open_timeout=10) as ws:
                ws.send(json.dumps({"type": "CloseStream"}))
                assert json.loads(ws.recv(timeout=30))["type"] == "Metadata"
        except InvalidStatus as refused:
            assert refused.response.status_code == 400, refused.response.body

    upgrade()


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["vllm", "openai", "deepgram"])
def test_hostile_fields_reach_no_bystander(voxtral_server, welcome, wire):
    samples = welcome[0][: 16000 * 3]
    alone = {name: text(voxtral_server, samples) for name, text in BYSTANDERS.items()}
    texts: dict[str, str] = {}
    bystanders = [
        threading.Thread(target=lambda n=name, t=text: texts.update({n: t(voxtral_server, samples)}))
        for name, text in BYSTANDERS.items()
    ]
    path, events = ATTACKS[wire]
    attacker = Attacker(voxtral_server, path)

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(events, min_size=1, max_size=4))
    def attack(events):
        attacker.throw(events)

    for bystander in bystanders:
        bystander.start()
    try:
        attack()
        if wire == "deepgram":
            hostile_queries(voxtral_server)
    finally:
        for bystander in bystanders:
            bystander.join(timeout=120)
        attacker.ws.close()
    assert texts == alone
    assert set(attacker.closes) <= FAIR_CLOSES, attacker.closes
    assert voxtral_server.get("/health/ready")[0] == 200
    wait_until(lambda: voxtral_server.metrics()["voxrt_kv_slots_used"] == 0, 60)
