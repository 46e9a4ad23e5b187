"""Whether an OpenAI item's `completed` should re-decode its turn whole instead of joining its deltas.

Prints one JSON line. The four real-speech passages (`benchmarks/real_speech.py`; `--speech
synthetic`: four synthetic ones) are streamed
through the engine with the VAD on, with no clock (one step per `--step` seconds of audio, one
thread: deterministic). Scored against the passages' reference text: the streamed text (what
the deltas, and so today's `completed` transcripts, add up to), and each turn the VAD heard
(from its start less 0.5 s to its end plus 0.3 s) decoded offline by the same model, joined.
With `--context S` a turn is decoded after up to S seconds of the turns before it, and only
the segments whose middle is in the turn itself are kept.
"""

import argparse
import json

import numpy as np
import torch
from transformers import WhisperFeatureExtractor

from benchmarks.reference import transformers_whisper
from benchmarks.speech import tiny_en_models
from benchmarks.streaming_wer import streamed_events
from benchmarks.text import mean_wer, whisper_wer
from benchmarks.whisper_streaming import offline_texts, speech_passages
from realtime.engine.events import Done, SpeechStarted, SpeechStopped
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.runner import WhisperRunner

LEAD_SECONDS, TAIL_SECONDS = 0.5, 0.3


def decode_from(model: WhisperModel, audio: np.ndarray, turn_start: float) -> str:
    """The text of `audio` from `turn_start` seconds on: the segments whose middle is there or later."""
    features = WhisperFeatureExtractor(feature_size=model.n_mels)(
        audio, sampling_rate=SAMPLE_RATE, return_tensors="pt"
    )
    with torch.inference_mode():
        ids = transformers_whisper(model).generate(features.input_features, return_timestamps=True)[0]
    ids = [t for t in ids.tolist() if t < model.eot or t >= model.timestamp_begin]
    segments = model.segments(ids)
    seconds = len(audio) / SAMPLE_RATE
    return "".join(s.text for s in segments if (s.start + (s.end or seconds)) / 2 >= turn_start - 0.1)


def redecoded(
    model: WhisperModel, audio: np.ndarray, turns: list[tuple[float, float]], context: float
) -> str:
    texts = []
    for k, (start, stop) in enumerate(turns):
        start, stop = max(0.0, start - LEAD_SECONDS), stop + TAIL_SECONDS
        before = [s for s, _ in turns[:k] if 0 < start - s <= context]
        first = max(min(before, default=start), stop - 29.0)
        piece = audio[int(first * SAMPLE_RATE) : int(stop * SAMPLE_RATE)]
        texts.append(
            decode_from(model, piece, start - first) if first < start else offline_texts(model, [piece])[0]
        )
    return " ".join(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=float, default=1.2, help="seconds of audio per step")
    parser.add_argument("--context", type=float, default=0.0)
    parser.add_argument("--speech", choices=("real", "synthetic"), default="real")
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(1)
    model, timing = tiny_en_models()
    passages = speech_passages(args.speech, model, timing, 4)
    streamed, whole = [], []
    for p in passages:
        engine = Engine(WhisperRunner(model))
        events = [e for _, e in streamed_events(engine, p.audio, round(args.step * SAMPLE_RATE))]
        streamed.append(next(e for e in events if isinstance(e, Done)).text)
        starts = [e.audio_ms / 1000 for e in events if isinstance(e, SpeechStarted)]
        stops = [e.audio_ms / 1000 for e in events if isinstance(e, SpeechStopped)]
        stops += [len(p.audio) / SAMPLE_RATE] * (len(starts) - len(stops))
        whole.append(redecoded(model, p.audio, list(zip(starts, stops, strict=True)), args.context))
    references = [p.text for p in passages]
    print(json.dumps({
        "model": "whisper-tiny.en int8", "speech": args.speech, "step_s": args.step,
        "context_s": args.context,
        "streamed_wer": mean_wer(whisper_wer, references, streamed),
        "turns_redecoded_wer": mean_wer(whisper_wer, references, whole),
        "offline_wer": mean_wer(whisper_wer, references, offline_texts(model, [p.audio for p in passages])),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
