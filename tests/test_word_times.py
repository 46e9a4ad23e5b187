"""Words with their times and confidences: the alignment against plain references, against
speech whose word boundaries are known, and on vLLM's wire over a real socket."""

import json
import time

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from benchmarks.real_speech import recording
from benchmarks.word_times import matches, streamed_words
from realtime.config import ServerConfig
from tests.conftest import espeak
from tests.server_harness import ServerThread, append_event, events_until
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.runner import WhisperRunner
from voxtral.whisper.timing import dtw_path
from voxtral.whisper.words import TokenWords


def plain_dtw_path(cost: np.ndarray) -> tuple[list[int], list[int]]:
    """The textbook recursion, cell by cell: the diagonal first on a tie, then from above."""
    rows, cols = cost.shape
    total = np.full((rows + 1, cols + 1), np.inf)
    total[0, 0] = 0
    step = np.zeros((rows + 1, cols + 1), np.int8)
    for i in range(1, rows + 1):
        for j in range(1, cols + 1):
            options = (total[i - 1, j - 1], total[i - 1, j], total[i, j - 1])
            k = int(np.argmin(options))
            total[i, j] = cost[i - 1, j - 1] + options[k]
            step[i, j] = k
    i, j, path = rows, cols, []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        i, j = {0: (i - 1, j - 1), 1: (i - 1, j), 2: (i, j - 1)}[int(step[i, j])]
    path.reverse()
    return [p[0] for p in path], [p[1] for p in path]


@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 12), st.integers(1, 40)),
        elements=st.integers(-3, 3).map(float),  # whole numbers: exact sums, and ties to break
    )
)
def test_dtw_path_is_the_plain_recursions_path(cost):
    text, time = dtw_path(cost)
    assert (text.tolist(), time.tolist()) == plain_dtw_path(cost)


def test_word_spans_are_the_words_the_policy_counts(whisper_model):
    m = whisper_model
    text = " Good morning, everyone. It's 10:30 -- isn't it?"
    tokens = m.tokenizer.encode(text, add_special_tokens=False).ids
    spans = TokenWords(m.tokenizer, m.timestamp_begin, spaced=True).word_spans(tokens)
    assert [m.tokenizer.decode(tokens[a : b + 1]).strip() for a, b in spans] == text.split()
    japanese = "おはようございます。私は田中です。"
    tokens = m.tokenizer.encode(japanese, add_special_tokens=False).ids
    spans = TokenWords(m.tokenizer, m.timestamp_begin, spaced=False).word_spans(tokens)
    assert len(spans) == len(japanese)
    assert all(a <= b for a, b in spans) and spans == sorted(spans)


def test_words_spoken_apart_are_timed_where_they_were_spoken(whisper_model, tmp_path):
    """espeak-ng says each word alone; joined with silences of known length, every word's
    start and end in the audio are known to the sample."""
    words = ["Please", "remember", "to", "bring", "your", "notes", "and", "your", "questions"]
    gaps = [0.3, 0.15, 0.45, 0.1, 0.35, 0.2, 0.5, 0.1, 0.6]
    parts, times, at = [np.zeros(int(0.4 * SAMPLE_RATE), np.float32)], [], 0.4
    for i, (word, gap) in enumerate(zip(words, gaps, strict=True)):
        audio = espeak(word, tmp_path / f"{i}.wav")
        voiced = np.flatnonzero(np.abs(audio) > 0.01)
        audio = audio[voiced[0] : voiced[-1] + 1]
        times.append((at, at + len(audio) / SAMPLE_RATE))
        parts += [audio, np.zeros(int(gap * SAMPLE_RATE), np.float32)]
        at += len(audio) / SAMPLE_RATE + gap
    streamed = streamed_words(WhisperRunner(whisper_model), np.concatenate(parts), 0.7)
    pairs = matches(words, [w.text for w in streamed])
    assert len(pairs) >= len(words) - 1, [w.text for w in streamed]
    start_errors = [abs(streamed[j].start - times[i][0]) for i, j in pairs]
    end_errors = [abs(streamed[j].end - times[i][1]) for i, j in pairs]
    # Without moving words off the silence at their edges: 0.30 s and 0.27 s on the benchmark's set.
    assert np.mean(start_errors) < 0.12 and np.mean(end_errors) < 0.12, (start_errors, end_errors)
    assert all(0.0 < w.probability <= 1.0 for w in streamed)


def test_vllm_wire_words_are_in_order_within_the_audio_and_spell_the_deltas(whisper_model):
    audio = recording("beckett").audio
    seconds = len(audio) / SAMPLE_RATE
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(), max_sessions=2)
    try:
        with harness.connect() as timed, harness.connect() as plain:
            timed.send(json.dumps({"type": "session.update", "word_timestamps": True}))
            for connection in (timed, plain):
                connection.send(json.dumps({"type": "input_audio_buffer.commit"}))
            for offset in range(0, len(audio), 3200):  # at 4x real time: several deltas, most likely
                for connection in (timed, plain):
                    connection.send(append_event(audio[offset : offset + 3200]))
                time.sleep(0.025)
            for connection in (timed, plain):
                connection.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
            events = events_until(timed, "transcription.done")
            untimed = events_until(plain, "transcription.done")
    finally:
        harness.stop()
    deltas = [e for e in events if e["type"] == "transcription.delta"]
    done = events[-1]
    for delta in deltas:
        assert " ".join(w["word"] for w in delta["words"]) == delta["delta"].strip()
    words = [w for delta in deltas for w in delta["words"]]
    assert done["words"] == words and " ".join(w["word"] for w in words) == done["text"]
    ends = [0.0]
    for w in words:
        assert ends[-1] <= w["start"] <= w["end"] <= seconds + 0.05, words
        assert 0.0 < w["probability"] <= 1.0
        ends.append(w["end"])
    # A client that did not ask gets today's events, field for field.
    assert all(set(e) == {"type", "delta"} for e in untimed if e["type"] == "transcription.delta")
    assert set(untimed[-1]) == {"type", "text", "usage"}
