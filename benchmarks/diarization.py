"""Speaker labels on conversations with known turns: how right, how soon, and at what cost.

Conversations (`benchmarks/conversations.py`): `--conversations` of each set (real readers,
two and three; synthetic voices, two and three), 8 turns of 1-15 s with pauses of 0.3-1.0 s;
then the conversation set's (`benchmarks/conversation_set.py`): the real telephone call
(`call`), and its built conversations of two readers (each condition) and of three.

Accuracy, without a clock (deterministic): each streams alone through the engine as served
(tiny.en), 100 ms a step, with speakers asked for.
- `word_accuracy`: committed words whose label is their speaker's, after the best one-to-one
  mapping of labels to speakers (a word's speaker is the turn at its middle). A label that no
  speaker maps to (one voice split in two) makes its words wrong.
- `der`: the diarization error rate of the speech segments as labelled at the end (the
  `SpeakerStream` the engine keeps, fed the same VAD and encoder), against the turns, in
  10 ms frames with no collar: missed speech, false alarm and confusion over the turns' time.
- `label_delay`: for each turn after the first, the seconds of audio from its start until the
  first committed word in it carrying its speaker's label was sent (p50, p90); `never`: turns
  whose words never carry it.

Cost, with a clock: `--sessions` sessions of real conversations, each its own, arriving 0.5 s
apart, stream in real time through `voxrt serve` (default flags), once with word times only and
once with speakers too (alternating which goes first, `--rounds` times each): the server's CPU
seconds per audio second, and the committed words' latency from their end in the audio to the
delta that carried them (p50, p95).

    .venv/bin/python -m benchmarks.diarization [--conversations 4] [--sessions 4] [--rounds 2]
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.client_process import ClientProcess, Refused
from benchmarks.conversation_set import conversation_set, phone_call
from benchmarks.conversations import (
    Conversation,
    conversation,
    label_mapping,
    real_voices,
    synthetic_voices,
    word_accuracy,
)
from benchmarks.served import cpu_seconds
from benchmarks.speech import tiny_en_models
from benchmarks.streaming_wer import streamed_events
from benchmarks.whisper_streaming import offline_texts, percentile
from realtime.engine.events import Delta, Done
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from tests.server_harness import ServerProcess
from voxtral.audio import SAMPLE_RATE
from voxtral.runner import TimedWord, Transcription
from voxtral.speaker_encoder import SpeakerEncoder
from voxtral.speakers import SpeakerStream
from voxtral.vad import Vad, VadStream
from voxtral.whisper.runner import WhisperRunner

FRAME_SECONDS = 0.01


def diarized(talk: Conversation, vad: Vad, encoder: SpeakerEncoder) -> SpeakerStream:
    """The speaker stream of `talk` as the engine keeps one, fed 100 ms at a time, to its end."""
    stream, heard = SpeakerStream(), VadStream()
    for offset in range(0, len(talk.audio), SAMPLE_RATE // 10):
        samples = talk.audio[offset : offset + SAMPLE_RATE // 10]
        stream.feed(samples)
        heard.feed(samples)
        clips = stream.hear(vad.probabilities([heard])[0])
        for (segment, _), embedding in zip(clips, encoder.embed([c for _, c in clips]), strict=True):
            stream.embedded(segment, embedding)
    return stream


def der(talk: Conversation, stream: SpeakerStream) -> float:
    """Missed, false and confused speech time over the turns' time, in 10 ms frames, with
    the labels mapped to speakers as the most frames agree."""
    frames = int(len(talk.audio) / SAMPLE_RATE / FRAME_SECONDS) + 1
    truth, said = np.full(frames, -1), np.full(frames, -1)
    for turn in talk.turns:
        truth[int(turn.start / FRAME_SECONDS) : int(turn.end / FRAME_SECONDS)] = turn.speaker
    for segment in stream.segments:
        if segment.speaker is not None:
            stop = segment.stop if segment.stop is not None else stream.heard
            said[
                int(segment.start / SAMPLE_RATE / FRAME_SECONDS) : int(stop / SAMPLE_RATE / FRAME_SECONDS)
            ] = segment.speaker
    both = (truth >= 0) & (said >= 0)
    mapping = label_mapping([(str(s), int(t)) for s, t in zip(said[both], truth[both], strict=True)])
    mapped = np.array([mapping.get(str(s), -2) if s >= 0 else -1 for s in said])
    missed = np.sum((truth >= 0) & (mapped == -1))
    false_alarm = np.sum((truth < 0) & (mapped != -1))
    confused = np.sum((truth >= 0) & (mapped != -1) & (mapped != truth))
    return float((missed + false_alarm + confused) / max(1, np.sum(truth >= 0)))


def label_delays(
    talk: Conversation, events: list[tuple[float, object]], words: list[TimedWord]
) -> list[float]:
    """Per turn after the first, seconds from its start to the first delta carrying a word of
    it labelled as its speaker; inf where none does."""
    mapping = label_mapping([(w.speaker, talk.speaker_at((w.start + w.end) / 2)) for w in words])
    delays = []
    for turn in talk.turns[1:]:
        sent = [
            at
            for at, event in events
            if isinstance(event, Delta)
            for w in event.words or []
            if turn.start <= (w.start + w.end) / 2 <= turn.end and mapping.get(w.speaker) == turn.speaker
        ]
        delays.append(min(sent) - turn.start if sent else float("inf"))
    return delays


def accuracy(runner: WhisperRunner, talks: list[Conversation]) -> dict:
    vad, encoder = Vad(), SpeakerEncoder()
    accuracies, ders, delays, labels = [], [], [], []
    for talk in talks:
        events = streamed_events(Engine(runner), talk.audio, SAMPLE_RATE // 10, Transcription(speakers=True))
        words = next(e for _, e in events if isinstance(e, Done)).words or []
        accuracies.append(word_accuracy(talk, words))
        ders.append(der(talk, diarized(talk, vad, encoder)))
        delays += label_delays(talk, events, words)
        labels.append(len({w.speaker for w in words}))
    heard = [d for d in delays if d != float("inf")]
    return {
        "conversations": len(talks),
        "speakers": len({t.speaker for t in talks[0].turns}),
        "word_accuracy": round(float(np.mean(accuracies)), 3),
        "word_accuracy_min": round(float(np.min(accuracies)), 3),
        "der": round(float(np.mean(ders)), 3),
        "labels": labels,
        "label_delay_p50_s": percentile(heard, 50),
        "label_delay_p90_s": percentile(heard, 90),
        "never": len(delays) - len(heard),
        "turns": len(delays),
    }


def word_latencies(result) -> list[float]:
    """Per committed word, from its end in the audio to when the delta carrying it arrived."""
    arrivals = [at for at, text in result.deltas for _ in text.split()]
    return [at - word["end"] for at, word in zip(arrivals, result.words, strict=False)]


def cost(talks: list[Conversation], speakers: bool, clients: ClientProcess) -> dict:
    server = ServerProcess()
    try:
        before = cpu_seconds(server.process.pid)
        audios = [t.audio for t in talks]
        arrivals = clients.stream_sessions(
            server.url, audios, arrival_seconds=0.5, word_timestamps=True, speakers=speakers
        )
        used = cpu_seconds(server.process.pid) - before
    finally:
        server.stop()
    seated = [a.result for a in arrivals if not isinstance(a.result, Refused)]
    latencies = [x for r in seated for x in word_latencies(r)]
    audio_seconds = sum(len(t.audio) for t in talks) / SAMPLE_RATE
    return {
        "speakers": speakers,
        "sessions": len(talks),
        "seated": len(seated),
        "cpu_s_per_audio_s": round(used / audio_seconds, 3),
        "committed_p50_s": percentile(latencies, 50),
        "committed_p95_s": percentile(latencies, 95),
        "errors": sum(len(r.errors) for r in seated),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=4, help="of each set")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    configure_logging("warning")
    model, timing = tiny_en_models()
    runner = WhisperRunner(model)
    real = real_voices()
    with tempfile.TemporaryDirectory() as tmp:
        synthetic = synthetic_voices(Path(tmp))
    sets = {}
    for name, voices in (("real", real), ("synthetic", synthetic)):
        for speakers in (2, 3):
            talks = [conversation(name, voices, speakers, 8, seed) for seed in range(args.conversations)]
            sets[f"{name}_{speakers}"] = accuracy(runner, talks)
    spoken = conversation_set(timing, lambda audio: offline_texts(model, [audio])[0])
    sets["call"] = accuracy(runner, [phone_call().conversation])
    built = [s.conversation for s in spoken if not s.held_out]
    sets["built_2"] = accuracy(runner, [c for c in built if c.name != "built-three"])
    sets["built_3"] = accuracy(runner, [c for c in built if c.name == "built-three"])
    sessions = [conversation("real", real, 2, 8, 100 + i) for i in range(args.sessions)]
    rows = []
    with ClientProcess() as clients:
        for round_ in range(args.rounds):
            for speakers in (False, True) if round_ % 2 == 0 else (True, False):
                rows.append(cost(sessions, speakers, clients))
    print(json.dumps({"accuracy": sets, "cost": rows}))


if __name__ == "__main__":
    main()
