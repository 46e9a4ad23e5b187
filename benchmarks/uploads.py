"""OpenAI's file API on a real `voxrt serve`: an hour of real speech uploaded, and a live
session's latency with two long uploads running beside it against the same with none.

The recordings are `benchmarks/real_speech.py`'s passages (three real readers, each passage
in its own order, pauses and faint noise), one after another to the length asked. The live
session streams a passage of its own in real time in 100 ms chunks from a client process of
its own (`benchmarks/client_process.py`); the uploads go through the openai SDK, unchanged.

Prints one JSON line: for the long upload, its seconds to the transcript, how many times
real time that is, WER against the passages' texts (the book's words where kept, else the
served model's offline transcript of each recording) and the server's peak RSS; for the live
session alone and beside the uploads, committed p50/p95 (from each word's end in the audio to
when it appeared and stayed) and WER, and how much of the uploads was done meanwhile.

    .venv/bin/python -m benchmarks.uploads [--minutes 60 (0: none)] [--live-seconds 60]
        [--upload-minutes 10] [--rounds 1]
"""

import argparse
import io
import json
import threading
import time
from pathlib import Path

import numpy as np
import openai
import soundfile

from benchmarks.client_process import ClientProcess, Refused
from benchmarks.real_speech import real_passages
from benchmarks.served import cut
from benchmarks.speech import Passage, tiny_en_models
from benchmarks.text import whisper_wer
from benchmarks.whisper_streaming import offline_texts, percentile, snapshots, word_latencies
from tests.server_harness import ServerProcess
from voxtral.audio import SAMPLE_RATE


def recording_of(passages: list[Passage], seconds: float) -> tuple[bytes, str]:
    """Passages one after another, to `seconds`: a FLAC, and the words read in it."""
    audio, texts, length = [], [], 0
    for p in passages:
        if length >= seconds * SAMPLE_RATE:
            break
        audio.append(p.audio)
        texts.append(p.text)
        length += len(p.audio)
    flac = io.BytesIO()
    soundfile.write(flac, np.concatenate(audio), SAMPLE_RATE, format="FLAC")
    return flac.getvalue(), " ".join(texts)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM")


def upload(port: int, data: bytes) -> tuple[str, float]:
    """The transcript, and the seconds it took."""
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=7200
    )
    started = time.monotonic()
    text = client.audio.transcriptions.create(file=("speech.flac", data), model="whisper-1").text
    return text, time.monotonic() - started


def live(server: ServerProcess, clients: ClientProcess, passage: Passage) -> dict:
    (arrival,) = clients.stream_sessions(server.url, [passage.audio])
    if isinstance(arrival.result, Refused):
        return {"refused": arrival.result.code}
    committed_at, _ = snapshots(arrival.result.deltas, arrival.result.interims)
    latencies = word_latencies(passage, committed_at)
    return {
        "committed_p50_s": percentile(latencies, 50),
        "committed_p95_s": percentile(latencies, 95),
        "wer": round(whisper_wer(passage.text, arrival.result.text), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0, help="of the long upload")
    parser.add_argument("--live-seconds", type=float, default=60.0)
    parser.add_argument(
        "--upload-minutes", type=float, default=10.0, help="of each upload beside the live one"
    )
    parser.add_argument("--rounds", type=int, default=1, help="of the live session alone, then beside")
    args = parser.parse_args()
    model, timing = tiny_en_models()
    count = int(max(args.minutes, args.upload_minutes) * 60 / 80) + 2  # a passage is about 80 s
    passages = real_passages(timing, lambda audio: offline_texts(model, [audio])[0], count)
    side_files = [recording_of(passages[i:] + passages[:i], args.upload_minutes * 60)[0] for i in (1, 2)]
    speaker = cut(passages[-1], args.live_seconds)
    server = ServerProcess()
    rounds = []
    try:
        long_row = None
        if args.minutes:
            long_file, long_text = recording_of(passages, args.minutes * 60)
            text, seconds = upload(server.port, long_file)
            audio_seconds = len(soundfile.read(io.BytesIO(long_file))[0]) / SAMPLE_RATE
            long_row = {
                "audio_s": round(audio_seconds, 1),
                "seconds": round(seconds, 1),
                "x_real_time": round(audio_seconds / seconds, 1),
                "wer": round(whisper_wer(long_text, text), 3),
                "peak_rss_mb": peak_rss_mb(server.process.pid),
            }
        with ClientProcess() as clients:
            for _ in range(args.rounds):
                rounds.append(live_alone_and_beside_uploads(server, clients, speaker, side_files))
    finally:
        server.stop()
    print(json.dumps({"settings": vars(args), "long_upload": long_row, "live": rounds}))


def live_alone_and_beside_uploads(
    server: ServerProcess, clients: ClientProcess, speaker: Passage, side_files: list[bytes]
) -> dict:
    alone = live(server, clients, speaker)
    done: list[float] = []
    threads = [
        threading.Thread(target=lambda data=data: done.append(upload(server.port, data)[1]))
        for data in side_files
    ]
    for thread in threads:
        thread.start()
    time.sleep(2.0)  # both uploads are in the engine
    beside = live(server, clients, speaker)
    beside["uploads_done_meanwhile"] = len(done)
    for thread in threads:
        thread.join()
    return {"alone": alone, "beside_two_uploads": beside, "upload_seconds": [round(s, 1) for s in done]}


if __name__ == "__main__":
    main()
