"""Concurrent real-time Whisper sessions on realistic speech: what a user sees, and when.

Prints one JSON line. Each of N sessions streams its own ~50 s passage
(`benchmarks/speech.py`: long sentences, several voices of two engines, pauses, noise), or
with `--speech real` its own ~85 s of people reading (`benchmarks/real_speech.py`: three
recordings in its own order; where a recording has no reference text, the served model's
offline text is its reference, so WER there is the streaming penalty) over a real socket in
100 ms chunks paced like a microphone, from a client process of its own
(`benchmarks/client_process.py`). Per word, latency is the time it first appears and stays,
minus its end in the audio (the model's own forced alignment): in the committed text
(`transcription.delta`) and in what the user sees (committed text plus the
`transcription.interim` tail). Also: WER of the final text against the offline WER of the same
model on the same audio (`wer` scored as Whisper's evaluations score English, `verbatim_wer` on
case and punctuation only: `benchmarks/text.py`), whether every session
kept up (its final text within 3 s of its audio's end), and the model's busy share.

The baseline is how streaming Whisper is usually written: every session, once per
second of new audio, runs transformers `generate` on its window padded to 30 s, one
session after another, committing with LocalAgreement.

    .venv/bin/python -m benchmarks.whisper_streaming [--policies alignatt,local-agreement]
        [--sessions 1,2,4,6,8] [--repeats 1] [--no-baseline] [--model whisper-base [--language en]]
        [--speech synthetic|real]

Word end times come from tiny.en (float32) whichever model is measured: the same clock for both.
With `--model whisper-base` sessions name `--language` (default: none, the model detects it).
"""

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from difflib import SequenceMatcher

import numpy as np
import torch
from transformers import WhisperFeatureExtractor

from benchmarks.client_process import ClientProcess
from benchmarks.real_speech import real_passages
from benchmarks.reference import transformers_whisper
from benchmarks.speech import Passage, passage
from benchmarks.text import mean_wer, normalize_words, whisper_wer, word_error_rate
from clients.connection import StreamedUtterance
from realtime.config import ServedModel, ServerConfig
from realtime.engine.capacity import CapacityConfig
from realtime.engine.config import EngineConfig
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from realtime.server import RealtimeServer
from voxtral.audio import SAMPLE_RATE
from voxtral.loading import served_cpu_weights
from voxtral.whisper.hypothesis import Hypothesis
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.policy import WhisperPolicy, WindowCommitter
from voxtral.whisper.runner import WhisperRunner
from voxtral.whisper.weights import TINY_EN, embedded_whisper_dir

KEEP_UP_SECONDS = 3.0
# Offline WER moves by points with a shift of the audio no one would hear (passages 0-5: 8.7,
# 7.9, 10.6, 9.2 % after 0, 0.1, 0.2, 0.3 s of silence), as a streamed run's moves with where its
# windows end: the offline reference is the mean over these shifts.
OFFLINE_SHIFTS = (0.0, 0.1, 0.2, 0.3)


def matched(words: list[str], text: str) -> set[int]:
    """Reference words that `text` shows: the words of the two, aligned as a diff, that agree.
    A misheard or missing stretch of any length costs only its own words."""
    reference = [" ".join(normalize_words(w)) for w in words]
    blocks = SequenceMatcher(None, reference, normalize_words(text), autojunk=False).get_matching_blocks()
    return {b.a + k for b in blocks for k in range(b.size)}


def stable_since(words: list[str], snapshots: list[tuple[float, str]]) -> dict[int, float]:
    """For each word shown by the last snapshot: when it appeared and stayed until the end."""
    since: dict[int, float] = {}
    shown_later: set[int] | None = None
    for at, text in reversed(snapshots):
        shown = matched(words, text)
        still = shown if shown_later is None else shown & shown_later
        for j in still:
            since[j] = at
        shown_later = still
    return since


def word_latencies(p: Passage, snapshots: list[tuple[float, str]]) -> list[float]:
    return [at - p.word_ends[j] for j, at in stable_since(p.words, snapshots).items()]


def snapshots(deltas: list[tuple[float, str]], interims: list[tuple[float, str]]):
    """The committed text after each delta, and what the user sees after every event.

    As the wire says: an interim replaces the last one, and a delta leaves it alone (the
    server sends the new tail right behind a delta that changed it). A client that cleared
    the tail at a delta would blink the words after it until that interim arrives.
    """
    events = sorted([(t, "delta", x) for t, x in deltas] + [(t, "interim", x) for t, x in interims])
    committed, tail = "", ""
    committed_at, shown_at = [], []
    for at, kind, text in events:
        if kind == "delta":
            committed += text
            committed_at.append((at, committed))
        else:
            tail = text
        shown_at.append((at, committed + " " + tail))
    return committed_at, shown_at


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def summarize(runs: list[dict], busy: float, wall: float) -> dict:
    """`runs` of the first N passages (of every repeat): words pooled; WER is each passage's,
    averaged, like the offline WER."""
    committed = [x for r in runs for x in r["committed"]]
    shown = [x for r in runs for x in r["shown"]]
    words = sum(len(r["passage"].words) for r in runs)
    references, texts = [r["passage"].text for r in runs], [r["text"] for r in runs]
    return {
        "keeps_up": bool(max(r["finish_lag"] for r in runs) <= KEEP_UP_SECONDS),
        "max_finish_lag_s": round(max(r["finish_lag"] for r in runs), 2),
        "busy_fraction": round(busy / wall, 3),
        "committed_p50_s": percentile(committed, 50),
        "committed_p95_s": percentile(committed, 95),
        "interim_p50_s": percentile(shown, 50),
        "interim_p95_s": percentile(shown, 95),
        "words_timed": f"{len(committed)}/{words}",
        "wer": mean_wer(whisper_wer, references, texts),
        "verbatim_wer": mean_wer(word_error_rate, references, texts),
    }


def english(model: WhisperModel) -> dict:
    """`generate` arguments for English passages: a multilingual model is told the language."""
    return {"language": "en"} if model.multilingual else {}


async def run_voxrt(
    model: WhisperModel,
    policy: WhisperPolicy,
    passages: list[Passage],
    language: str | None,
    clients: ClientProcess,
) -> tuple[list[dict], float, float]:
    """The passages streamed at once by `clients` to a server in this
    process: per passage its text, word latencies and finish lag; the model's busy seconds; the wall."""
    n = len(passages)
    # N sessions however many measured capacity would admit, none shed: this measures the
    # policy under load (`benchmarks/capacity.py` measures admission).
    unlimited = CapacityConfig(target_busy=100, max_lag_seconds=3600)
    engine = Engine(WhisperRunner(model, policy), EngineConfig(max_sessions=n, capacity=unlimited))
    served = ServedModel(name="whisper-tiny.en", names=frozenset({"whisper"}))
    server = RealtimeServer(engine, ServerConfig(port=0), served)
    await server.start()
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    started = time.monotonic()
    results = await asyncio.to_thread(
        clients.stream_sessions, url, [p.audio for p in passages], True, language
    )
    wall = time.monotonic() - started
    await server.drain_and_stop()
    runs = []
    for p, arrival in zip(passages, results, strict=True):
        result = arrival.result
        assert isinstance(result, StreamedUtterance), result  # every session is admitted
        committed, shown = snapshots(result.deltas, result.interims)
        runs.append(
            {
                "passage": p,
                "text": result.text,
                "committed": word_latencies(p, committed),
                "shown": word_latencies(p, shown),
                "finish_lag": result.done_at - len(p.audio) / SAMPLE_RATE,
            }
        )
    return runs, engine.model_seconds, wall


def run_baseline(model: WhisperModel, passages: list[Passage]) -> dict:
    """One `generate` per session per second of new audio, sessions one after another."""
    extractor = WhisperFeatureExtractor(feature_size=model.n_mels)
    reference = transformers_whisper(model)
    policy = WhisperPolicy()
    sessions = [
        {
            "p": p,
            "start": 0,
            "decoded": 0,
            "commits": [],
            "text": "",
            "done_at": None,
            "agreement": WindowCommitter(),
        }
        for p in passages
    ]
    busy = 0.0
    t0 = time.monotonic()
    while any(s["done_at"] is None for s in sessions):
        progressed = False
        for s in sessions:
            if s["done_at"] is not None:
                continue
            audio = s["p"].audio
            available = min(len(audio), int((time.monotonic() - t0) * SAMPLE_RATE) // 1600 * 1600)
            final = available == len(audio)
            if available - s["decoded"] < SAMPLE_RATE and not final:
                continue
            window = audio[s["start"] : available]
            seconds = len(window) / SAMPLE_RATE
            features = extractor(window, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
            started = time.monotonic()  # busy is model time on both sides
            with torch.inference_mode():
                tokens = reference.generate(features, return_timestamps=True, **english(model))[0].tolist()
            segments = model.segments([t for t in tokens if t >= model.timestamp_begin or t < model.eot])
            hyp = Hypothesis(tokens, segments, 0.0, 0.0) if segments else None
            force = seconds > policy.max_window_seconds
            commit = s["agreement"].update(hyp, final, force, seconds > policy.trim_after_seconds, seconds)
            if commit.clear:
                s["start"] = (
                    available if hyp is not None or final else max(s["start"], available - SAMPLE_RATE)
                )
            elif commit.trim_seconds > 0:
                s["start"] += int(commit.trim_seconds * SAMPLE_RATE)
            s["decoded"] = available
            busy += time.monotonic() - started
            at = time.monotonic() - t0
            if commit.text:
                s["text"] += (" " if s["text"] else "") + commit.text
                s["commits"].append((at, s["text"]))
            if final:
                s["done_at"] = at
            progressed = True
        if not progressed:
            time.sleep(0.01)
    wall = time.monotonic() - t0
    runs = [
        {
            "passage": s["p"],
            "text": s["text"],
            "committed": word_latencies(s["p"], s["commits"]),
            "shown": word_latencies(s["p"], s["commits"]),
            "finish_lag": s["done_at"] - len(s["p"].audio) / SAMPLE_RATE,
        }
        for s in sessions
    ]
    return summarize(runs, busy, wall)


def offline_texts(model: WhisperModel, audios: list[np.ndarray]) -> list[str]:
    """The same model transcribing each whole recording offline (transformers' long-form generate)."""
    extractor = WhisperFeatureExtractor(feature_size=model.n_mels)
    texts = []
    for audio in audios:
        features = extractor(
            audio,
            sampling_rate=SAMPLE_RATE,
            return_tensors="pt",
            truncation=False,
            padding="longest",
            return_attention_mask=True,
        )
        with torch.inference_mode():
            ids = transformers_whisper(model).generate(
                features.input_features,
                attention_mask=features.attention_mask,
                return_timestamps=True,
                **english(model),
            )
        texts.append(model.tokenizer.decode([t for t in ids[0].tolist() if t < model.eot]))
    return texts


def speech_passages(speech: str, model: WhisperModel, timing: WhisperModel, count: int) -> list[Passage]:
    """`count` passages of real (`real_speech.py`) or synthetic (`speech.py`) speech, their words
    timed by `timing`; a recording with no reference text is scored against `model`'s offline text."""
    if speech == "real":
        return real_passages(timing, lambda audio: offline_texts(model, [audio])[0], count)
    return [passage(timing, i) for i in range(count)]


def policy_fields(given: list[str]) -> dict:
    """`--set FIELD=VALUE`s as `WhisperPolicy` fields of their own types."""
    defaults = WhisperPolicy()
    fields = dict(item.split("=", 1) for item in given)
    return {name: type(getattr(defaults, name))(value) for name, value in fields.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policies", default="alignatt,local-agreement")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a WhisperPolicy field, as measured"
    )
    parser.add_argument("--sessions", default="1,2,4,6,8")
    parser.add_argument("--no-baseline", action="store_true")
    # Where a step ends each session's windows changes what the model hears: at 4 sessions
    # one run's WER moves ~2 points run to run. Repeats pool the words of several runs.
    parser.add_argument("--repeats", type=int, default=1, help="runs per session count, pooled")
    parser.add_argument("--model", default=TINY_EN, help="an embedded model: whisper-tiny.en or whisper-base")
    parser.add_argument("--language", default=None, help="what whisper-base sessions name (default: none)")
    parser.add_argument(
        "--speech",
        choices=("synthetic", "real"),
        default="synthetic",
        help="benchmarks/speech.py or real_speech.py",
    )
    args = parser.parse_args()
    configure_logging("warning")  # stdout carries the one JSON line
    torch.set_num_threads(2)
    # As `voxrt serve` loads it on this CPU, and the float32 model it is made from.
    cpu, served = torch.device("cpu"), served_cpu_weights()
    model = WhisperModel(embedded_whisper_dir(args.model), cpu, torch.float32, served)
    float32 = WhisperModel(embedded_whisper_dir(args.model), cpu, torch.float32)
    timing = (
        float32 if args.model == TINY_EN else WhisperModel(embedded_whisper_dir(TINY_EN), cpu, torch.float32)
    )
    counts = [int(n) for n in args.sessions.split(",")]
    passages = speech_passages(args.speech, model, timing, max(counts))
    out: dict = {
        "speech": args.speech,
        "model": args.model,
        "language": args.language,
        "repeats": args.repeats,
        "passage_seconds": [round(len(p.audio) / SAMPLE_RATE, 1) for p in passages],
        "voices": [p.voice for p in passages],
        "policy_set": policy_fields(args.set),
    }
    with ClientProcess() as clients:
        for name in args.policies.split(","):
            policy = WhisperPolicy(commit_policy=name, **policy_fields(args.set))
            out[name] = {}
            for n in counts:
                repeats = [
                    asyncio.run(run_voxrt(model, policy, passages[:n], args.language, clients))
                    for _ in range(args.repeats)
                ]
                runs, busy, wall = zip(*repeats, strict=True)
                pooled = summarize([run for each in runs for run in each], sum(busy), sum(wall))
                pooled["wer_per_run"] = [summarize(*repeat)["wer"] for repeat in repeats]
                out[name][str(n)] = pooled
    # After the streamed runs: streaming right after these long-form decodes measured
    # slower (shown p95 1.07-1.53 s against 0.93-1.07 s at 4 sessions, five runs each).
    references = [p.text for p in passages]
    offline = {
        key: [offline_texts(m, [p.delayed(shift).audio for p in passages]) for shift in OFFLINE_SHIFTS]
        for key, m in ((served, model), ("float32", float32))
    }

    def offline_mean(score: Callable[[str, str], float], key: str, n: int) -> float:
        return round(float(np.mean([mean_wer(score, references[:n], t[:n]) for t in offline[key]])), 4)

    out["offline_shifts_s"] = OFFLINE_SHIFTS
    out["offline_wer"] = {str(n): offline_mean(whisper_wer, served, n) for n in counts}
    out["offline_wer_per_shift"] = {
        str(n): [mean_wer(whisper_wer, references[:n], t[:n]) for t in offline[served]] for n in counts
    }
    out["offline_verbatim_wer"] = {str(n): offline_mean(word_error_rate, served, n) for n in counts}
    out["offline_wer_float32"] = {str(n): offline_mean(whisper_wer, "float32", n) for n in counts}
    if not args.no_baseline:
        out["baseline"] = {}
        for n in counts:
            out["baseline"][str(n)] = run_baseline(model, passages[:n])
            if not out["baseline"][str(n)]["keeps_up"]:
                break  # more sessions only fall further behind
    print(json.dumps(out))


if __name__ == "__main__":
    main()
