"""Conversations through `voxrt serve`, against the same model offline: what a call or a meeting
streamed, uploaded or sent fast comes back as, per condition.

The conversation set (`benchmarks/conversation_set.py`: a real telephone call and a real
dialogue, held out; two readers taking short turns with back-channels, clean and in each
condition). Each build (`benchmarks/served.py`'s `--build`) gets a fresh `voxrt serve` (default
flags) per number of sessions (`--sessions`): the set streams in rounds of that many sessions at
once, each its own conversation, arriving 0.5 s apart, in real time in 100 ms chunks from a
client process (a refused session retries after `Retry-After`). On the one-session server each
conversation is then uploaded through the file API (`upload`) and streamed with no pacing at all
(`unpaced`): how fast audio comes must not change what is heard. `offline`: the served model as
`voxrt serve` loads it on this CPU, transformers' `generate` on pieces of at most 28 s cut at
quiet moments (`benchmarks/real_speech.pieces`), as the build before this benchmark was judged.

Prints one JSON line: per build and path (`live1`, `live4`, ..., `upload`, `unpaced`, and
`offline`), each conversation's WER (Whisper's English normalization), the set's pooled WER
(word errors over words: all, held out, built), results that came back empty, uploads the server
failed (an error answered: counted, their words missed), refusals.

    .venv/bin/python -m benchmarks.conversation_wer --build base=DIR --build this=. [--sessions 1,4]
"""

import argparse
import asyncio
import io
import json
import os
from pathlib import Path

import numpy as np
import openai
import soundfile

from benchmarks.client_process import ClientProcess, Refused
from benchmarks.conversation_set import Spoken, conversation_set
from benchmarks.real_speech import pieces
from benchmarks.served import Build, commit
from benchmarks.speech import tiny_en_models
from benchmarks.text import pooled_wer, whisper_wer
from benchmarks.whisper_streaming import offline_texts
from clients.connection import open_connection, stream_utterance
from tests.server_harness import ServerProcess
from voxtral.audio import SAMPLE_RATE

ARRIVAL_SECONDS = 0.5
RETRY_SECONDS = 120.0


def cpu() -> str:
    """The CPU's model and the widest of AMX, AVX-512, AVX2 it has: figures differ by kind."""
    info = Path("/proc/cpuinfo").read_text()
    name = next(
        (line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?"
    )
    flags = set(
        next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    )
    kind = next(
        (k for k, f in (("AMX", "amx_tile"), ("AVX-512", "avx512f"), ("AVX2", "avx2")) if f in flags), "none"
    )
    return f"{name}, {kind}, {os.cpu_count()} cores"


def scores(conversations: list[Spoken], texts: list[str | None], refused: int = 0) -> dict:
    """`texts`: None where the server answered an error."""
    failed = sum(t is None for t in texts)
    empty = sum(t is not None and not t.strip() for t in texts)
    texts = [t or "" for t in texts]

    def pooled(which: list[int]) -> float:
        return pooled_wer([conversations[i].text for i in which], [texts[i] for i in which])

    everyone = range(len(conversations))
    return {
        "wer": {c.name: round(whisper_wer(c.text, t), 3) for c, t in zip(conversations, texts, strict=True)},
        "pooled": pooled(list(everyone)),
        "held_out": pooled([i for i in everyone if conversations[i].held_out]),
        "built": pooled([i for i in everyone if not conversations[i].held_out]),
        "empty": empty,
        "failed": failed,
        "refused": refused,
    }


def wav(audio: np.ndarray) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, audio, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


def upload(sdk: openai.OpenAI, audio: np.ndarray) -> str | None:
    """The file API's text; None where the server answered an error (it says why in its log)."""
    try:
        return sdk.audio.transcriptions.create(file=("c.wav", wav(audio)), model="whisper-1").text
    except openai.APIStatusError:
        return None


async def unpaced(url: str, audio: np.ndarray) -> str:
    async with await open_connection(url) as connection:
        return (await stream_utterance(connection, audio, 100, 0.0)).text


def live(server: ServerProcess, clients: ClientProcess, conversations: list[Spoken], sessions: int) -> dict:
    texts, refused = [], 0
    for first in range(0, len(conversations), sessions):
        audios = [c.audio for c in conversations[first : first + sessions]]
        arrivals = clients.stream_sessions(
            server.url, audios, arrival_seconds=ARRIVAL_SECONDS, retry_seconds=RETRY_SECONDS
        )
        for arrival in arrivals:
            refused += len(arrival.refusals)
            texts.append("" if isinstance(arrival.result, Refused) else arrival.result.text)
    return scores(conversations, texts, refused)


def run(build: Build, conversations: list[Spoken], counts: list[int], clients: ClientProcess) -> dict:
    out = {}
    for sessions in counts:
        server = ServerProcess(*build.flags, checkout=build.root, env=build.env)
        try:
            out[f"live{sessions}"] = live(server, clients, conversations, sessions)
            if sessions == 1:
                sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="-", max_retries=0)
                out["upload"] = scores(conversations, [upload(sdk, c.audio) for c in conversations])
                out["unpaced"] = scores(
                    conversations, [asyncio.run(unpaced(server.url, c.audio)) for c in conversations]
                )
        finally:
            server.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", action="append", required=True, help="NAME=DIR or NAME=DIR|FLAGS")
    parser.add_argument("--sessions", default="1,4")
    args = parser.parse_args()
    builds = [Build.parse(spec) for spec in args.build]
    counts = [int(n) for n in args.sessions.split(",")]
    model, timing = tiny_en_models()

    def offline(audio: np.ndarray) -> str:
        return " ".join(offline_texts(model, [audio[a:b] for a, b in pieces(audio)]))

    conversations = conversation_set(timing, offline)
    rows = {"offline": scores(conversations, [offline(c.audio) for c in conversations])}
    with ClientProcess() as clients:
        for build in builds:
            rows[build.name] = run(build, conversations, counts, clients)
    conditions = {c.name: c.condition for c in conversations}
    builds_out = {b.name: {"flags": b.flags, "env": b.env, "commit": commit(b.root)} for b in builds}
    print(json.dumps({"cpu": cpu(), "conditions": conditions, "builds": builds_out, "rows": rows}))


if __name__ == "__main__":
    main()
