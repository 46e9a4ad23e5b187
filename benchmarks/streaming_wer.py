"""Streamed WER against offline WER without a clock: deterministic, so one run can tell a point.

Each `benchmarks/speech.py` passage (long sentences, several voices, pauses, noise), or with
`--speech real` each recording of `benchmarks/real_speech.py` (scored against its reference
text where one is kept, else the same model's offline text of it), or with `--speech served`
the first `--passages` sessions of `benchmarks/served.py` (the recordings in each session's own
order, pauses and faint noise, cut as it cuts them), at each
start offset (that much silence before it: where windows end moves tiny.en's WER by points),
streams alone through the engine with no real-time pacing, one step per `--step` seconds of
audio (a real-time session's window is decoded about once per 0.5 s alone, and once per 1.2 s
at 4 sessions, where a step decodes one window of a turn going on) on one torch thread, as
`voxrt serve`'s lanes decode (a bfloat16 encoder's sums split over two threads round otherwise,
and another text would be scored than the one served); the same model, as `voxrt serve` loads
it on a CPU, transcribes it offline too. Prints one JSON line: the mean WER of each, scored
as Whisper's evaluations score English and verbatim (`benchmarks/text.py`), and a digest of the
streamed texts.

    .venv/bin/python -m benchmarks.streaming_wer [--speech real|served] [--passages 6] [--offsets 0,0.25]
        [--step 0.7]
"""

import argparse
import hashlib
import json
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.real_speech import REFERENCES, real_passages, recording
from benchmarks.served import SESSION_SECONDS, cut
from benchmarks.speech import passage, tiny_en_models
from benchmarks.text import mean_wer, whisper_wer, word_error_rate
from benchmarks.whisper_streaming import offline_texts
from realtime.engine.events import AudioConsumed, Done, EngineEvent, Failed
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from voxtral.audio import SAMPLE_RATE
from voxtral.runner import Transcription
from voxtral.whisper.model import CPU_WEIGHTS, WhisperModel
from voxtral.whisper.runner import WhisperRunner


def streamed_events(
    engine: Engine, audio: np.ndarray, step_samples: int, transcription: Transcription = Transcription()
) -> list[tuple[float, EngineEvent]]:
    """`audio` through `engine` with no clock, `step_samples` per step: its events, to `Done`,
    each with the seconds of audio sent when its step ran; an utterance that fails raises."""
    events: list[tuple[float, EngineEvent]] = []
    sent = 0
    engine.on_events = lambda batch: events.extend(
        (sent / SAMPLE_RATE, event) for _, event in batch if not isinstance(event, AudioConsumed)
    )
    engine.add_utterance("u", transcription=transcription)
    for offset in range(0, len(audio), step_samples):
        engine.add_audio("u", audio[offset : offset + step_samples])
        sent = min(len(audio), offset + step_samples)
        engine.run_once()
    engine.finish_input("u")
    while not events or not isinstance(events[-1][1], Done | Failed):
        engine.run_once()
    if isinstance(failed := events[-1][1], Failed):
        raise RuntimeError(f"the utterance failed: {failed.code}: {failed.message}")
    return events


def streamed(
    engine: Engine, audio: np.ndarray, step_samples: int, transcription: Transcription = Transcription()
) -> Done:
    """What `audio` streamed through `engine` with no clock finally said."""
    events = streamed_events(engine, audio, step_samples, transcription)
    return next(e for _, e in events if isinstance(e, Done))


def clips(
    speech: str, timing: WhisperModel, model: WhisperModel, count: int
) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (audio, reference): synthetic passages with their text, the served benchmark's
    sessions or the real recordings, with their reference text where one is kept, else the
    model's offline text of them."""
    if speech == "synthetic":
        return {str(i): (p.audio, p.text) for i in range(count) for p in [passage(timing, i)]}
    if speech == "served":
        sessions = real_passages(timing, lambda audio: offline_texts(model, [audio])[0], count)
        return {str(i): (p.audio, p.text) for i, s in enumerate(sessions) for p in [cut(s, SESSION_SECONDS)]}
    out = {}
    for name in REFERENCES:
        r = recording(name)
        out[name] = (r.audio, r.reference or offline_texts(model, [r.audio])[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--speech", choices=("synthetic", "real", "served"), default="synthetic")
    parser.add_argument("--passages", type=int, default=6, help="synthetic passages, or served sessions")
    parser.add_argument("--offsets", default="0,0.25", help="seconds of silence before each passage")
    parser.add_argument("--step", type=float, default=0.7, help="seconds of audio per engine step")
    parser.add_argument("--cpu-weights", choices=CPU_WEIGHTS, help="(default: as `voxrt serve` on this CPU)")
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(1)
    model, timing = tiny_en_models(args.cpu_weights)
    step = round(args.step * SAMPLE_RATE)
    references, texts, offline = {}, {}, {}
    for name, (audio, reference) in clips(args.speech, timing, model, args.passages).items():
        for seconds in map(float, args.offsets.split(",")):
            shifted = np.concatenate([np.zeros(round(seconds * SAMPLE_RATE), np.float32), audio])
            key = f"{name}@{seconds}"
            references[key] = reference
            texts[key] = streamed(Engine(WhisperRunner(model)), shifted, step).text  # a runner per engine
            offline[key] = offline_texts(model, [shifted])[0]

    def mean(score: Callable[[str, str], float], texts: dict[str, str]) -> float:
        return mean_wer(score, [references[k] for k in texts], list(texts.values()))

    print(
        json.dumps(
            {
                "speech": args.speech,
                "step_s": args.step,
                "streamed_wer": mean(whisper_wer, texts),
                "offline_wer": mean(whisper_wer, offline),
                "streamed_verbatim_wer": mean(word_error_rate, texts),
                "offline_verbatim_wer": mean(word_error_rate, offline),
                # What was streamed, to the byte: a change meant to keep behaviour keeps this.
                "streamed_sha256": hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest(),
                "per_passage": {
                    k: [round(whisper_wer(references[k], each[k]), 3) for each in (texts, offline)]
                    for k in texts
                },
            }
        )
    )


if __name__ == "__main__":
    main()
