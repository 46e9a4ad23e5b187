"""Turn ends on real speech with pauses in the middle of sentences: how often a turn is ended
too early, and how soon after the speaker finished it ends, with silence alone (`server_vad`)
against the semantic end of turn (`semantic_vad` at each eagerness).

Speech: moonshine-voice's readers (`two_cities`, `beckett`, `endgame_nagg_nell`), cut into
turns at their sentence ends (the served model's offline punctuation, timed by its alignment).
In each turn the reader hesitates once, for 0.4-1.5 s, after a word that ends no clause; after
each turn, 4.5 s of a quiet room (noise 60 dB down). Each session draws its own hesitations.

Through one `voxrt serve` on OpenAI's wire (24 kHz, real time), `--sessions` at once, each
configuration in turn on the same server:
- `early_per_100_turns`: turns ended at a hesitation (`speech_stopped` inside it), per 100 turns;
- `missed`: sentence ends after which no turn ended before the next turn began;
- `end_latency_p50_s`/`p95`: from the sentence's last word (as a real-time sender sends it) to
  the `completed` event of the item it ended;
- `cpu_per_audio_second`: the server's CPU seconds over the sessions' audio seconds.

    .venv/bin/python -m benchmarks.turn_ends [--sessions 1,4] [--configs server_vad,high,auto,low]
"""

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

import numpy as np
import soxr
from websockets.asyncio.client import connect

from benchmarks.conversation_wer import cpu
from benchmarks.real_speech import recording, timed_words
from benchmarks.served import cpu_seconds
from benchmarks.speech import tiny_en_models
from benchmarks.whisper_streaming import offline_texts, percentile
from clients.connection import send_audio
from clients.openai_turns import RATE
from tests.server_harness import ServerProcess
from voxtral.audio import SAMPLE_RATE

READERS = ("two_cities", "beckett", "endgame_nagg_nell")
HESITATION_SECONDS = (0.4, 1.5)
GAP_SECONDS = 4.5  # after each turn
CHUNK_SECONDS = 0.1
CONFIGS = {
    "server_vad": {"type": "server_vad"},
    "high": {"type": "semantic_vad", "eagerness": "high"},
    "auto": {"type": "semantic_vad", "eagerness": "auto"},
    "low": {"type": "semantic_vad", "eagerness": "low"},
}


@dataclass(frozen=True)
class Sentence:
    audio: np.ndarray  # 16 kHz
    ends: list[float]  # each word's end, seconds into `audio`
    clause_ends: list[bool]  # each word ends a clause (punctuation after it)


@dataclass(frozen=True)
class Session:
    audio: np.ndarray  # 16 kHz
    hesitations: list[tuple[float, float]]  # seconds into `audio`
    turn_ends: list[float]  # each sentence's last word's end


def sentences() -> list[Sentence]:
    model, timing = tiny_en_models()
    out = []
    for name in READERS:
        audio = recording(name).audio
        words, ends = timed_words(timing, lambda clip: offline_texts(model, [clip])[0], audio)
        start = 0
        for index, word in enumerate(words):
            if word.endswith((".", "?", "!")) or index == len(words) - 1:
                first = float(ends[start - 1]) if start else 0.0
                cut = int((float(ends[index]) + 0.15) * SAMPLE_RATE)
                piece = audio[int(first * SAMPLE_RATE) : cut]
                out.append(
                    Sentence(
                        piece,
                        [float(e) - first for e in ends[start : index + 1]],
                        [w.endswith((",", ";", ":", ".", "?", "!")) for w in words[start : index + 1]],
                    )
                )
                start = index + 1
    return [s for s in out if sum(not c for c in s.clause_ends[:-1]) > 0]


def quiet(seconds: float, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(0, 1e-3, int(seconds * SAMPLE_RATE)).astype(np.float32)


def session(said: list[Sentence], seed: int) -> Session:
    """Every sentence as a turn, each with one hesitation of its own after a word ending no clause."""
    rng = np.random.default_rng(seed)
    parts, hesitations, turn_ends, at = [], [], [], 0.0
    for sentence in said:
        inside = [i for i, ends_clause in enumerate(sentence.clause_ends[:-1]) if not ends_clause]
        word = int(rng.choice(inside))
        cut = int((sentence.ends[word] + 0.03) * SAMPLE_RATE)
        pause = float(rng.uniform(*HESITATION_SECONDS))
        parts += [sentence.audio[:cut], quiet(pause, rng), sentence.audio[cut:], quiet(GAP_SECONDS, rng)]
        hesitations.append((at + cut / SAMPLE_RATE, at + cut / SAMPLE_RATE + pause))
        turn_ends.append(at + pause + sentence.ends[-1])
        at += pause + len(sentence.audio) / SAMPLE_RATE + GAP_SECONDS
    return Session(np.concatenate(parts), hesitations, turn_ends)


async def stream(url: str, audio: np.ndarray, turn_detection: dict) -> tuple[float, list[tuple]]:
    """`audio` in real time with `turn_detection`; when it started, and (kind, wall time, audio
    seconds, item) for each `speech_stopped` and `completed`."""
    samples = soxr.resample(audio, SAMPLE_RATE, RATE).astype(np.float32)
    events: list[tuple] = []
    async with connect(url + "?intent=transcription", max_size=None) as connection:
        await connection.recv()  # session.created
        session = {"type": "transcription", "audio": {"input": {"turn_detection": turn_detection}}}
        await connection.send(json.dumps({"type": "session.update", "session": session}))
        started = time.monotonic()

        async def send_all() -> None:
            chunk = int(RATE * CHUNK_SECONDS)
            for offset in range(0, len(samples), chunk):
                await asyncio.sleep(max(0.0, started + (offset + chunk) / RATE - time.monotonic()))
                await send_audio(connection, samples[offset : offset + chunk])
            await connection.send(json.dumps({"type": "input_audio_buffer.commit"}))

        sender = asyncio.create_task(send_all())
        committed: set[str] = set()
        completed: set[str] = set()
        while not (sender.done() and completed >= committed and committed):
            try:
                event = json.loads(await asyncio.wait_for(connection.recv(), 0.5))
            except TimeoutError:
                continue
            kind, now = event["type"], time.monotonic()
            if kind == "input_audio_buffer.speech_stopped":
                events.append(("stopped", now, event["audio_end_ms"] / 1000, event["item_id"]))
            elif kind == "input_audio_buffer.committed":
                committed.add(event["item_id"])
            elif kind == "conversation.item.input_audio_transcription.completed":
                completed.add(event["item_id"])
                events.append(("completed", now, None, event["item_id"]))
            elif kind == "error":
                raise RuntimeError(event)
        await sender
    return started, events


def scores(sessions: list[Session], runs: list[tuple[float, list[tuple]]]) -> dict:
    early = missed = turns = 0
    latencies = []
    for truth, (started, events) in zip(sessions, runs, strict=True):
        stops = [(at, item) for kind, _, at, item in events if kind == "stopped"]
        done_at = {item: now for kind, now, _, item in events if kind == "completed"}
        for start, end in truth.hesitations:
            early += any(start - 0.1 <= at <= end + 0.1 for at, _ in stops)
        for index, end in enumerate(truth.turn_ends):
            turns += 1
            resumed = truth.hesitations[index + 1][0] if index + 1 < len(truth.hesitations) else float("inf")
            ended = [item for at, item in stops if end - 0.5 <= at <= min(resumed, end + GAP_SECONDS)]
            if not ended or ended[0] not in done_at:
                missed += 1
                continue
            latencies.append(done_at[ended[0]] - (started + end))
    return {
        "turns": turns,
        "early_per_100_turns": round(100 * early / turns, 1),
        "missed": missed,
        "end_latency_p50_s": percentile(latencies, 50),
        "end_latency_p95_s": percentile(latencies, 95),
    }


async def run_all(url: str, sessions: list[Session], turn_detection: dict) -> list:
    return await asyncio.gather(*(stream(url, s.audio, turn_detection) for s in sessions))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", default="1,4")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    said = sentences()
    rows = []
    server = ServerProcess()
    try:
        for count in [int(c) for c in args.sessions.split(",")]:
            sessions = [session(said, seed) for seed in range(count)]
            audio_seconds = sum(len(s.audio) for s in sessions) / SAMPLE_RATE
            for name in args.configs.split(","):
                before = cpu_seconds(server.process.pid)
                runs = asyncio.run(run_all(server.url, sessions, CONFIGS[name]))
                spent = cpu_seconds(server.process.pid) - before
                row = {"sessions": count, "config": name, **scores(sessions, runs)}
                row["cpu_per_audio_second"] = round(spent / audio_seconds, 3)
                rows.append(row)
    finally:
        server.stop()
    print(json.dumps({"cpu": cpu(), "sentences": len(said), "rows": rows}))


if __name__ == "__main__":
    main()
