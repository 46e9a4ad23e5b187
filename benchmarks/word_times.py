"""Streamed word times and confidences, checked: prints one JSON line.

- **Known boundaries**: sentences of `benchmarks/speech.py` spoken one word at a time by
  espeak-ng (and flite), each word's audio trimmed to its voice and joined with silences of
  drawn lengths, so where every word starts and ends is known to the sample.
- **Real speech**: the recordings of `benchmarks/real_speech.py`, where the reference is the
  same model's offline alignment of its offline text (`benchmarks/alignment.py`, the whole
  recording in pieces of at most 28 s).
Each clip streams alone through the engine as `voxrt serve` runs it (tiny.en int8, word times
asked for) with no clock, one step per `--step` s of audio (deterministic). A streamed word is
compared where it matches a reference word (the two texts aligned as a diff); the figures are
the mean and 95th percentile of |streamed - reference| for starts and ends, in ms.

Confidence: each streamed word's probability against whether it is right (it matches a word
of the reference text: the book's for two_cities, the offline text for the others; the
sentences for the synthetic clips): the AUC (the chance that a right word is more probable
than a wrong one) and the error rate of the least sure tenth of the words against the rest.

    .venv/bin/python -m benchmarks.word_times [--sentences 8] [--offsets 0,0.25] [--step 0.7]
"""

import argparse
import json
import tempfile
from difflib import SequenceMatcher
from pathlib import Path

import numpy as np
import torch

from benchmarks.alignment import word_times
from benchmarks.real_speech import REFERENCES, pieces, recording
from benchmarks.speech import SENTENCES, synthesize, tiny_en_models
from benchmarks.streaming_wer import streamed
from benchmarks.text import normalize_words
from benchmarks.whisper_streaming import offline_texts
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from voxtral.audio import SAMPLE_RATE
from voxtral.runner import TimedWord, Transcription
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.runner import WhisperRunner

VOICES = [("espeak-ng", "en-us", 165), ("flite", "slt", 0), ("espeak-ng", "en-gb-x-rp", 155)]
GAP_SECONDS = (0.05, 0.5)  # silence between words, drawn per word


def streamed_words(runner: WhisperRunner, audio: np.ndarray, step_seconds: float) -> list[TimedWord]:
    step = round(step_seconds * SAMPLE_RATE)
    done = streamed(Engine(runner), audio, step, Transcription(word_times=True))
    return done.words or []


def matches(reference: list[str], streamed: list[str]) -> list[tuple[int, int]]:
    """(reference index, streamed index) of the words the two texts agree on, aligned as a diff."""
    a = [" ".join(normalize_words(w)) for w in reference]
    b = [" ".join(normalize_words(w)) for w in streamed]
    blocks = SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    return [(m.a + k, m.b + k) for m in blocks for k in range(m.size)]


def spoken_word_by_word(sentence_count: int) -> list[tuple[np.ndarray, list[str], list[tuple[float, float]]]]:
    """Clips of words spoken alone and joined with silences: (audio, words, (start, end) of each)."""
    clips = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for index, sentence in enumerate(SENTENCES[:sentence_count]):
            engine, voice, rate = VOICES[index % len(VOICES)]
            parts = [np.zeros(int(0.3 * SAMPLE_RATE), np.float32)]
            at = len(parts[0]) / SAMPLE_RATE
            words, times = sentence.split(), []
            for word in words:
                audio = synthesize(engine, voice, rate, word, Path(tmp))
                times.append((at, at + len(audio) / SAMPLE_RATE))
                gap = np.zeros(int(rng.uniform(*GAP_SECONDS) * SAMPLE_RATE), np.float32)
                parts += [audio, gap]
                at += (len(audio) + len(gap)) / SAMPLE_RATE
            clips.append((np.concatenate(parts), words, times))
    return clips


def offline_timed(model: WhisperModel, audio: np.ndarray):
    """The model's offline words of a recording, each with its aligned (start, end)."""
    words, times = [], []
    for start, stop in pieces(audio):
        piece_words = offline_texts(model, [audio[start:stop]])[0].split()
        words += piece_words
        offset = start / SAMPLE_RATE
        times += [(offset + a, offset + b) for a, b in word_times(model, audio[start:stop], piece_words)]
    return words, times


def time_errors(reference: list[str], times: list[tuple[float, float]], streamed: list[TimedWord]):
    pairs = matches(reference, [w.text for w in streamed])
    starts = [abs(streamed[j].start - times[i][0]) for i, j in pairs]
    ends = [abs(streamed[j].end - times[i][1]) for i, j in pairs]
    return starts, ends, len(pairs)


def summary_ms(values: list[float]) -> dict:
    return {
        "mean": round(1000 * float(np.mean(values))),
        "p95": round(1000 * float(np.percentile(values, 95))),
    }


def confidence(labelled: list[tuple[float, bool]]) -> dict:
    """AUC of probability for right against wrong words, and the least sure tenth's error rate."""
    right = np.array([p for p, ok in labelled if ok])
    wrong = np.array([p for p, ok in labelled if not ok])
    auc = float((right[:, None] > wrong[None]).mean() + 0.5 * (right[:, None] == wrong[None]).mean())
    ranked = sorted(labelled)
    tenth = max(1, len(ranked) // 10)
    low, rest = ranked[:tenth], ranked[tenth:]
    return {
        "words": len(labelled),
        "wrong": len(wrong),
        "auc": round(auc, 3),
        "least_sure_tenth_error_rate": round(sum(not ok for _, ok in low) / len(low), 3),
        "rest_error_rate": round(sum(not ok for _, ok in rest) / max(1, len(rest)), 3),
    }


def labelled(reference_text: str, streamed: list[TimedWord]) -> list[tuple[float, bool]]:
    right = {j for _, j in matches(reference_text.split(), [w.text for w in streamed])}
    return [(w.probability, j in right) for j, w in enumerate(streamed)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=8, help="synthetic sentences, spoken word by word")
    parser.add_argument("--offsets", default="0,0.25", help="seconds of silence before each real recording")
    parser.add_argument("--step", type=float, default=0.7, help="seconds of audio per engine step")
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(2)
    model, _ = tiny_en_models()
    runner = WhisperRunner(model)
    out: dict = {"model": "whisper-tiny.en int8", "step_s": args.step}

    starts, ends, matched, total, known_conf = [], [], 0, 0, []
    for audio, words, times in spoken_word_by_word(args.sentences):
        streamed = streamed_words(runner, audio, args.step)
        s, e, n = time_errors(words, times, streamed)
        starts, ends, matched, total = starts + s, ends + e, matched + n, total + len(words)
        known_conf += labelled(" ".join(words), streamed)
    out["known_boundaries"] = {
        "words_matched": f"{matched}/{total}",
        "start_error_ms": summary_ms(starts),
        "end_error_ms": summary_ms(ends),
    }

    starts, ends, matched, total, real_conf = [], [], 0, 0, []
    for name in REFERENCES:
        r = recording(name)
        for seconds in map(float, args.offsets.split(",")):
            audio = np.concatenate([np.zeros(round(seconds * SAMPLE_RATE), np.float32), r.audio])
            words, times = offline_timed(model, audio)
            streamed = streamed_words(runner, audio, args.step)
            s, e, n = time_errors(words, times, streamed)
            starts, ends, matched, total = starts + s, ends + e, matched + n, total + len(words)
            real_conf += labelled(r.reference or " ".join(words), streamed)
    out["real_vs_offline_alignment"] = {
        "words_matched": f"{matched}/{total}",
        "start_error_ms": summary_ms(starts),
        "end_error_ms": summary_ms(ends),
    }
    out["confidence_real"] = confidence(real_conf)
    out["confidence_synthetic"] = confidence(known_conf)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
