"""The conversation set: what calls and meetings sound like, with known words and turns, beside
the read set (`benchmarks/real_speech.py`).

Real conversations, as packages ship them (read where pip put them; neither is imported):
- `call`: pyannote.audio's sample (`pyannote/audio/sample/`, MIT licence): 30 s of a
  telephone call between two women, quiet (-33 dBFS), turns of 0.4-6.7 s, with its
  transcript (`sample.stm`) and turns (`sample.rttm`).
- `dialogue`: moonshine-voice's `endgame_nagg_nell.wav` (MIT): 28 s, two voices in a scene
  of Beckett's *Endgame*; no transcript is kept: its words are the served model's offline.

Built from the real readers as calls and meetings sound (`built`): two readers (`two_cities`,
`beckett`) taking turns of 0.3-3 s, each turn a piece of the reader's recording cut at a quiet
moment, with back-channels ("yeah", "okay", "right": espeak-ng) between them; its words are
those the served model hears offline in each clean recording, the pieces' by where they end.
Each condition is that conversation changed one way: `telephone` (8 kHz through a G.711
mu-law round trip), `quiet` (-40 dBFS RMS), `hot` (6 dB past full scale, clipped), `overlap`
(each turn starts 0.2-1 s before the last ends), `far_field` (the second reader reverberant),
`noise` (white noise at 15 dB SNR), `three` (a third reader, moonshine's `clone-test`).

The real conversations are held out: nothing is tuned on them; the built ones are what a
change may be tuned on.
"""

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import numpy as np
import soxr

from benchmarks.conversations import Conversation, Turn, cuts, real_voices
from benchmarks.real_speech import recording, timed_words
from benchmarks.speech import synthesize
from clients.audio import SAMPLE_RATE, load_audio_file
from voxtral.whisper.model import WhisperModel

Transcribe = Callable[[np.ndarray], str]
BACK_CHANNELS = ["yeah", "okay", "right", "yes"]
TURN_SECONDS = (0.3, 3.0)
CONDITIONS = ["clean", "telephone", "quiet", "hot", "overlap", "far_field", "noise", "three"]


@dataclass(frozen=True)
class Spoken:
    """A conversation of the set: its audio, turns and words."""

    conversation: Conversation
    text: str  # the words said, in the order their turns start
    condition: str
    held_out: bool  # never tuned on

    @property
    def name(self) -> str:
        return self.conversation.name

    @property
    def audio(self) -> np.ndarray:
        return self.conversation.audio


def _sample_file(name: str) -> Path:
    try:
        return Path(distribution("pyannote.audio").locate_file(f"pyannote/audio/sample/{name}"))
    except PackageNotFoundError as exc:
        raise RuntimeError(
            "the real call needs pyannote.audio's files: bash scripts/setup.sh installs them"
        ) from exc


def phone_call() -> Spoken:
    """pyannote.audio's sample call, its words from the transcript and its turns from the RTTM."""
    speakers: dict[str, int] = {}
    turns = []
    for line in _sample_file("sample.rttm").read_text().splitlines():
        fields = line.split()
        start, length = float(fields[3]), float(fields[4])
        turns.append(Turn(speakers.setdefault(fields[7], len(speakers)), start, start + length))
    said = [line.split(maxsplit=5) for line in _sample_file("sample.stm").read_text().splitlines()]
    text = " ".join(fields[5] for fields in sorted(said, key=lambda f: float(f[3])))
    audio = load_audio_file(_sample_file("sample.wav"))
    return Spoken(Conversation("call", audio, turns), text, "telephone", held_out=True)


def dialogue(transcribe: Transcribe) -> Spoken:
    audio = recording("endgame_nagg_nell").audio
    return Spoken(Conversation("dialogue", audio, []), transcribe(audio), "dialogue", held_out=True)


@dataclass(frozen=True)
class Reader:
    audio: np.ndarray
    words: list[str]
    ends: list[float]  # seconds, one per word


def _reader(audio: np.ndarray, timing: WhisperModel, transcribe: Transcribe) -> Reader:
    words, ends = timed_words(timing, transcribe, audio)
    return Reader(audio, words, ends)


def _turn_pieces(reader: Reader, lengths: list[float]) -> list[tuple[np.ndarray, str]]:
    """Pieces of about `lengths` seconds of the reader's recording, one after another, each cut
    at the quietest 50 ms of its last third or the third after, with the words that end in it."""
    out = []
    for at, cut in cuts(reader.audio, lengths, SAMPLE_RATE // 20, (2, 3), 2 * SAMPLE_RATE):
        ends = zip(reader.words, reader.ends, strict=True)
        words = [w for w, end in ends if at / SAMPLE_RATE < end <= cut / SAMPLE_RATE]
        out.append((reader.audio[at:cut], " ".join(words)))
    return out


def _back_channel(word: str, tmp: Path) -> np.ndarray:
    return synthesize("espeak-ng", "en-us", 170, word, tmp)


def built(
    readers: list[Reader], tmp: Path, seed: int, turns: int = 16, overlap: bool = False, name: str = "built"
) -> Spoken:
    """`turns` turns of 0.3-3 s among `readers`, never the same twice in a row, a pause of
    0.1-0.6 s before each (or, with `overlap`, a start 0.2-1 s before the last turn's end); after
    every third turn, a back-channel (espeak-ng's voice, counted as the listener's turn)."""
    rng = np.random.default_rng(seed)
    order = [0]
    while len(order) < turns:
        order.append(int(rng.choice([s for s in range(len(readers)) if s != order[-1]])))
    lengths = {s: [float(rng.uniform(*TURN_SECONDS)) for t in order if t == s] for s in range(len(readers))}
    pieces = {s: _turn_pieces(readers[s], lengths[s]) for s in range(len(readers))}
    placed: list[tuple[int, int, np.ndarray, str]] = []  # (speaker, start sample, audio, words)
    end = 0
    for index, speaker in enumerate(order):
        audio, words = pieces[speaker].pop(0)
        if overlap and placed:
            start = max(placed[-1][1], end - int(rng.uniform(0.2, 1.0) * SAMPLE_RATE))
        else:
            start = end + int(rng.uniform(0.1, 0.6) * SAMPLE_RATE)
        placed.append((speaker, start, audio, words))
        end = start + len(audio)
        if index % 3 == 2:
            listener = order[index + 1] if index + 1 < len(order) else order[index - 1]
            word = BACK_CHANNELS[int(rng.integers(len(BACK_CHANNELS)))]
            sound = _back_channel(word, tmp)
            start = end + int(0.15 * SAMPLE_RATE)
            placed.append((listener, start, sound, word))
            end = start + len(sound)
    audio = np.zeros(end + SAMPLE_RATE, np.float32)
    for _, start, sound, _ in placed:
        audio[start : start + len(sound)] += sound
    truth = [Turn(s, start / SAMPLE_RATE, (start + len(a)) / SAMPLE_RATE) for s, start, a, _ in placed]
    text = " ".join(words for _, _, _, words in sorted(placed, key=lambda p: p[1]) if words)
    return Spoken(Conversation(name, np.clip(audio, -1, 1), truth), text, "clean", held_out=False)


def telephone(audio: np.ndarray) -> np.ndarray:
    """8 kHz through G.711's mu-law (as a phone line carries it) and back to 16 kHz."""
    narrow = np.clip(soxr.resample(audio, SAMPLE_RATE, 8000), -1, 1)
    mu = 255.0
    encoded = np.round(np.sign(narrow) * np.log1p(mu * np.abs(narrow)) / np.log1p(mu) * 127) / 127
    decoded = np.sign(encoded) * np.expm1(np.abs(encoded) * np.log1p(mu)) / mu
    return soxr.resample(decoded.astype(np.float32), 8000, SAMPLE_RATE).astype(np.float32)


def at_level(audio: np.ndarray, dbfs: float) -> np.ndarray:
    """`audio` scaled to an RMS of `dbfs` over its speech."""
    speech = audio[np.abs(audio) > 0.01 * np.abs(audio).max()]
    gain = 10 ** (dbfs / 20) / np.sqrt(np.mean(np.square(speech)))
    return (audio * gain).astype(np.float32)


def reverberant(audio: np.ndarray, seed: int, rt60: float = 0.6) -> np.ndarray:
    """`audio` in a room: convolved with decaying noise (the reverberation time `rt60`) after
    the direct sound, at the direct sound's level."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rt60 * SAMPLE_RATE)) / SAMPLE_RATE
    response = rng.normal(0, 1, len(t)) * np.exp(-6.9 * t / rt60) * 0.1
    response[0] = 1.0
    wet = np.convolve(audio, response)[: len(audio)]
    return (wet * np.abs(audio).max() / max(1e-9, np.abs(wet).max())).astype(np.float32)


def noisy(audio: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
    speech = audio[np.abs(audio) > 0.01 * np.abs(audio).max()]
    power = float(np.mean(np.square(speech))) / 10 ** (snr_db / 10)
    noise = np.random.default_rng(seed).normal(0, np.sqrt(power), len(audio))
    return np.clip(audio + noise, -1, 1).astype(np.float32)


def conversation_set(timing: WhisperModel, transcribe: Transcribe) -> list[Spoken]:
    """The real conversations, then the built one in each condition (`CONDITIONS`)."""
    voices = real_voices()  # two_cities, beckett, clone-test
    readers = [_reader(audio, timing, transcribe) for audio in voices]
    out = [phone_call(), dialogue(transcribe)]
    with tempfile.TemporaryDirectory() as tmp:
        two = built(readers[:2], Path(tmp), seed=1)
        overlapping = built(readers[:2], Path(tmp), seed=1, overlap=True)
        three = built(readers, Path(tmp), seed=3, turns=18)
    second = [t for t in two.conversation.turns if t.speaker == 1]
    far = two.audio.copy()
    for turn in second:  # the second reader's turns reverberant, as from across a room
        lo, hi = int(turn.start * SAMPLE_RATE), int(turn.end * SAMPLE_RATE)
        far[lo:hi] = reverberant(far[lo:hi], seed=int(turn.start * 1000))
    changed = {
        "clean": two.audio,
        "telephone": telephone(two.audio),
        "quiet": at_level(two.audio, -40),
        "hot": np.clip(two.audio * 2 / np.abs(two.audio).max(), -1, 1),
        "far_field": far,
        "noise": noisy(two.audio, 15, seed=2),
    }
    for condition, audio in changed.items():
        conversation = replace(two.conversation, name=f"built-{condition}", audio=audio.astype(np.float32))
        out.append(replace(two, conversation=conversation, condition=condition))
    out.append(
        replace(
            overlapping,
            conversation=replace(overlapping.conversation, name="built-overlap"),
            condition="overlap",
        )
    )
    out.append(
        replace(three, conversation=replace(three.conversation, name="built-three"), condition="three")
    )
    return out
