"""Known speech for benchmarks: espeak-ng sentences with pauses, and where each word ends."""

import subprocess
import tempfile
from pathlib import Path

import numpy as np

from clients.audio import SAMPLE_RATE, load_audio_file

SENTENCES = [
    "Good morning everyone",
    "Today we will talk about the weather in the city",
    "It was raining all night, but the sun came out this morning",
    "Many people went to the park to walk their dogs",
    "The children played on the grass and the birds were singing in the trees",
    "In the afternoon we will have a meeting about the new school building",
    "Please bring your notes and arrive on time",
    "Thank you for listening, and have a nice day",
]


def speech_with_word_ends(
    voice: str = "en-us", rate: int = 150, pause: float = 0.8
) -> tuple[np.ndarray, list[str], list[float]]:
    """Audio, its words, and each word's end in seconds.

    Sentences are synthesized one by one, so their bounds are exact; inside a sentence
    espeak-ng speaks at a steady rate and a word's end is placed by its share of the
    sentence's letters (good to about a syllable).
    """
    pieces, words, ends = [], [], []
    offset = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, sentence in enumerate(SENTENCES):
            raw, wav = Path(tmp) / f"{i}.raw.wav", Path(tmp) / f"{i}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(raw), sentence], check=True)
            subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(wav)], check=True)
            audio = load_audio_file(wav)
            voiced = np.flatnonzero(np.abs(audio) > 0.01)
            start, stop = (voiced[0], voiced[-1]) if len(voiced) else (0, len(audio))
            sentence_words = sentence.split()
            total = sum(len(w) + 1 for w in sentence_words)
            done = 0
            for word in sentence_words:
                done += len(word) + 1
                words.append(word)
                ends.append((offset + start + (stop - start) * done / total) / SAMPLE_RATE)
            pieces += [audio, np.zeros(int(pause * SAMPLE_RATE), np.float32)]
            offset += len(audio) + int(pause * SAMPLE_RATE)
    return np.concatenate(pieces), words, ends


def match_commits(words: list[str], ends: list[float], commits: list[tuple[float, str]]) -> list[float]:
    """Latency of each committed word: commit time minus the end of the word it matches.

    Committed words are walked in order against the reference, matching each to the next
    reference word with the same letters within a few words (so one misheard word does not
    derail the rest); unmatched words are skipped.
    """

    def norm(w: str) -> str:
        return "".join(c for c in w.lower() if c.isalnum())

    latencies, cursor = [], 0
    for at, text in commits:
        for word in text.split():
            for j in range(cursor, min(cursor + 4, len(words))):
                if norm(words[j]) == norm(word):
                    latencies.append(at - ends[j])
                    cursor = j + 1
                    break
    return latencies
