"""A phone line's G.711 against linear PCM at the same 8 kHz, on real speech: each recording
goes through one `voxrt serve` on Deepgram's wire three ways at once (linear16, mu-law,
A-law, all at 8 kHz), in real time, so the three meet the same load.

Speech: pyannote.audio's real telephone call (its transcript) and moonshine-voice's readers
(`two_cities` against the book's text; `beckett` and the `endgame_nagg_nell` dialogue against
the served model's offline transcript of the 16 kHz recording). G.711 is coded by the standard
library's coder (`audioop`), the server's decoder being voxrt's own.

    .venv/bin/python -m benchmarks.telephone [--speed 1] [--rounds 1]

One JSON line: per coding, the pooled WER over all recordings and rounds, and each recording's
mean WER over the rounds; each round turns the order the three connect in; and per coding the
times the server refused a seat (`refused`: three sessions on an idle server should never be).
"""

import argparse
import asyncio
import json
import warnings
from collections.abc import Callable

import numpy as np
import soxr
from websockets.exceptions import InvalidStatus

from benchmarks.conversation_set import phone_call
from benchmarks.conversation_wer import cpu
from benchmarks.real_speech import recording
from benchmarks.speech import tiny_en_models
from benchmarks.text import pooled_wer, whisper_wer
from benchmarks.whisper_streaming import offline_texts
from clients.audio import SAMPLE_RATE, float32_to_pcm16
from clients.listen import listen
from tests.server_harness import ServerProcess

RATE = 8000
CODINGS = ("linear16", "mulaw", "alaw")


def coded(audio: np.ndarray, coding: str) -> bytes:
    """16 kHz audio as a phone line carries it: 8 kHz, then `coding`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # audioop: the reference coder here
        import audioop
    linear = float32_to_pcm16(soxr.resample(audio, SAMPLE_RATE, RATE))
    if coding == "linear16":
        return linear
    return audioop.lin2ulaw(linear, 2) if coding == "mulaw" else audioop.lin2alaw(linear, 2)


def speech() -> list[tuple[str, np.ndarray, str]]:
    """(name, 16 kHz audio, the words said) of each recording."""
    call = phone_call()
    out = [("call", call.audio, call.text)]
    model, _ = tiny_en_models()
    for name in ("two_cities", "beckett", "endgame_nagg_nell"):
        read = recording(name)
        out.append((name, read.audio, read.reference or offline_texts(model, [read.audio])[0]))
    return out


async def one_round(
    url: str, recordings: list, speed: float, turn: int, refused: dict[str, int]
) -> dict[str, list[str]]:
    """Each recording streamed in every coding at once, the codings' order turned by `turn`
    (which connects first): the texts, per coding, in order. A busy server's refusals are
    counted in `refused` and retried after `Retry-After`: three sessions fit an idle server."""
    texts: dict[str, list[str]] = {coding: [] for coding in CODINGS}
    order = CODINGS[turn % 3 :] + CODINGS[: turn % 3]

    def count(coding: str) -> Callable[[InvalidStatus], None]:
        return lambda _: refused.update({coding: refused[coding] + 1})

    for _, audio, _ in recordings:
        results = await asyncio.gather(
            *(listen(url, coded(audio, c), c, RATE, speed=speed, on_refused=count(c)) for c in order)
        )
        for coding, result in zip(order, results, strict=True):
            assert result.done is not None and not result.errors, result.errors
            texts[coding].append(result.text)
    return texts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--speed", type=float, default=1.0, help="x real time")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    recordings = speech()
    references = [said for _, _, said in recordings] * args.rounds
    texts: dict[str, list[str]] = {coding: [] for coding in CODINGS}
    refused = dict.fromkeys(CODINGS, 0)
    server = ServerProcess()
    try:
        for turn in range(args.rounds):
            said = asyncio.run(one_round(server.url, recordings, args.speed, turn, refused))
            for coding in CODINGS:
                texts[coding] += said[coding]
    finally:
        server.stop()
    out = {"cpu": cpu(), "rate": RATE, "speed": args.speed, "rounds": args.rounds, "refused": refused}
    for coding in CODINGS:
        every = len(recordings)
        rounds = {name: texts[coding][index::every] for index, (name, *_) in enumerate(recordings)}
        out[coding] = {
            "pooled_wer": round(pooled_wer(references, texts[coding]), 4),
            "per_recording": {  # the mean over the rounds
                name: round(float(np.mean([whisper_wer(said, text) for text in rounds[name]])), 4)
                for name, _, said in recordings
            },
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
