"""Known speech for benchmarks, shaped like real use: long sentences, several voices, pauses, noise.

Each session reads its own passage of about 50 s: long sentences (6-12 s without a
pause) and a few short ones, spoken by one of several voices of two synthesis engines
(Debian's espeak-ng, and flite's CMU ARCTIC voices, which sound closer to a person),
with pauses of 0.3-1.2 s between sentences and, for every other session, background
noise at 25 dB SNR. Word end times come from the model's own alignment of the known
text (`benchmarks/alignment.py`), sentence by sentence.
"""

import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.alignment import word_ends
from clients.audio import SAMPLE_RATE, load_audio_file
from voxtral.loading import served_cpu_weights
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.weights import TINY_EN, embedded_whisper_dir

SENTENCES = [
    "Good morning everyone, and thank you for joining the planning meeting on such short notice this week.",
    "The first thing we need to decide is whether the new library should open in the spring or wait until "
    "the building inspection is finished in the autumn.",
    "Several people have written to the council to say that the park behind the station is too dark at night "
    "and that the paths need better lights.",
    "Let us start with the budget.",
    "Last year we spent most of the money on repairs to the old school roof, so there was very little "
    "left for the playground and the sports field.",
    "The children who walk to school along the river road have asked for a safer crossing near the bakery, "
    "where the cars come around the corner very quickly.",
    "I have a short question about the bus timetable.",
    "When the summer holidays begin, the buses will run every twenty minutes instead of every ten, and the "
    "last bus will leave the market square at eleven in the evening.",
    "My grandmother grew up in a small village by the sea, where her father repaired fishing boats and her "
    "mother sold bread and vegetables at the weekly market.",
    "We should thank the volunteers.",
    "The volunteers who cleaned the beach last weekend collected more than two hundred bags of plastic, old "
    "ropes and broken bottles in a single afternoon.",
    "If the weather stays dry tomorrow, the team will paint the fence around the community garden and plant "
    "the new apple trees next to the greenhouse.",
    "Please remember to bring your notes and your questions to the next meeting on Thursday.",
    "The museum will show a collection of old maps and photographs that tell the story of how the town grew "
    "from a few farms into a busy harbour.",
    "Doctors recommend that adults walk for at least thirty minutes every day, drink enough water and get "
    "about eight hours of sleep each night.",
    "Thank you all for listening, and have a pleasant evening.",
]

# (engine, voice, words per minute for espeak-ng)
VOICES = [
    ("flite", "slt", 0),
    ("espeak-ng", "en-us", 165),
    ("flite", "rms", 0),
    ("espeak-ng", "en-gb-x-rp", 155),
    ("flite", "awb", 0),
    ("flite", "kal16", 0),
]
PASSAGE_SECONDS = 50.0
NOISE_SNR_DB = 25.0


@dataclass
class Passage:
    audio: np.ndarray
    words: list[str]
    word_ends: list[float]  # seconds from the start of `audio`, one per word
    text: str
    voice: str

    def delayed(self, seconds: float) -> "Passage":
        """The passage after `seconds` of silence."""
        audio = np.concatenate([np.zeros(round(seconds * SAMPLE_RATE), np.float32), self.audio])
        return replace(self, audio=audio, word_ends=[end + seconds for end in self.word_ends])


def synthesize(engine: str, voice: str, rate: int, text: str, tmp: Path) -> np.ndarray:
    raw, wav = tmp / "raw.wav", tmp / "16k.wav"
    if engine == "flite":
        subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(raw)], check=True)
    else:
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(raw), text], check=True)
    # -D: sox dithers when it resamples (espeak-ng speaks at 22 kHz), a new noise every run.
    resample = ["sox", "-D", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(wav)]
    subprocess.run(resample, check=True)
    audio = load_audio_file(wav)
    voiced = np.flatnonzero(np.abs(audio) > 0.01)
    return audio[voiced[0] : voiced[-1] + 1] if len(voiced) else audio


def passage(model: WhisperModel, index: int) -> Passage:
    """Session `index`'s passage: its own voice, order of sentences, pauses and noise."""
    rng = np.random.default_rng(index)
    engine, voice, rate = VOICES[index % len(VOICES)]
    order = np.roll(np.arange(len(SENTENCES)), -3 * index)
    pieces = [np.zeros(int(rng.uniform(0.2, 0.6) * SAMPLE_RATE), np.float32)]
    offset = len(pieces[0]) / SAMPLE_RATE
    words: list[str] = []
    ends: list[float] = []
    texts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in order:
            sentence = SENTENCES[i]
            audio = synthesize(engine, voice, rate, sentence, Path(tmp))
            sentence_words = sentence.split()
            words += sentence_words
            ends += [offset + e for e in word_ends(model, audio, sentence_words)]
            texts.append(sentence)
            pause = np.zeros(int(rng.uniform(0.3, 1.2) * SAMPLE_RATE), np.float32)
            pieces += [audio, pause]
            offset += (len(audio) + len(pause)) / SAMPLE_RATE
            if offset >= PASSAGE_SECONDS:
                break
    audio = np.concatenate(pieces)
    if index % 2:
        power = float(np.mean(audio[np.abs(audio) > 0.01] ** 2))
        noise = rng.normal(0, np.sqrt(power / 10 ** (NOISE_SNR_DB / 10)), len(audio))
        audio = np.clip(audio + noise.astype(np.float32), -1, 1)
    return Passage(audio, words, ends, " ".join(texts), f"{engine}:{voice}")


def tiny_en_models(cpu_weights: str | None = None) -> tuple[WhisperModel, WhisperModel]:
    """tiny.en as `voxrt serve` loads it on this CPU (`cpu_weights` None) or with those CPU
    weights, and in float32 for `passage`'s word ends."""
    cpu = torch.device("cpu")
    path = embedded_whisper_dir(TINY_EN)
    served = WhisperModel(path, cpu, torch.float32, cpu_weights or served_cpu_weights())
    return served, WhisperModel(path, cpu, torch.float32)
