"""A turn's end that the last decode of the turn heard through commits that decode's hypothesis
whole instead of decoding the same audio again: on real speech, every event (words, their
times, interim text) equals the plain path's, which decodes that window again; and a decode
falling due in a pause waits for the tail a turn's end reads, so most turns' ends need none."""

from dataclasses import replace

import pytest

from benchmarks.real_speech import recording
from benchmarks.streaming_wer import streamed_events
from realtime.engine.events import Delta, Done, Interim
from realtime.engine.loop import Engine
from scheduler import Request
from voxtral.runner import Transcription
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.runner import WhisperRunner
from voxtral.whisper.stream import WhisperStream, Window

pytestmark = pytest.mark.untimed

SECONDS = 30.0  # of each recording: several turns, each ended by a pause
CHUNK = 1600  # 0.1 s a step, as a real-time client sends


class DecodedAgain(WhisperRunner):
    """The plain path: a turn's end that the last decode heard through is decoded again, the
    same window, the words that decode committed forced."""

    def __init__(self, model: WhisperModel) -> None:
        super().__init__(model)
        self.ends = 0

    def new_state(self, request: Request, transcription: Transcription) -> WhisperStream:
        state = super().new_state(request, transcription)
        heard_through = state.heard_through

        def decoded_again(end: int) -> Window | None:
            if (heard := heard_through(end)) is None:
                return None
            self.ends += 1
            return replace(heard, hypothesis=None)

        state.heard_through = decoded_again
        return state


def decoded_windows(runner: WhisperRunner) -> list[int]:
    """Counts the windows `runner` decodes, from now on."""
    counted, decode = [0], runner.decoder.decode

    def counting(windows):
        counted[0] += len(windows)
        return decode(windows)

    runner.decoder.decode = counting
    return counted


@pytest.mark.parametrize("name", ["two_cities", "endgame_nagg_nell"])
def test_a_turn_end_heard_through_commits_what_decoding_it_again_would(whisper_model, name):
    audio = recording(name).audio[: round(SECONDS * 16000)]
    asked = Transcription(word_times=True)
    runners = {"reused": WhisperRunner(whisper_model), "again": DecodedAgain(whisper_model)}
    counts = {way: decoded_windows(runner) for way, runner in runners.items()}
    events = {way: streamed_events(Engine(runner), audio, CHUNK, asked) for way, runner in runners.items()}
    said = {way: what_was_said(each) for way, each in events.items()}
    assert said["reused"] == said["again"]
    assert probabilities(events["reused"]) == pytest.approx(probabilities(events["again"]), abs=1e-4)
    ends = runners["again"].ends
    assert ends >= 3  # the turns' ends this checks
    assert counts["again"][0] - counts["reused"][0] == ends
    assert len(said["reused"][-1][1].split()) > 40 and said["reused"][-1][2]


def what_was_said(events: list[tuple[float, object]]) -> list[tuple[float, str, list]]:
    """Each committed text (with its words' times), interim text and the final text, with the
    audio seconds sent when it came; not how long it waited on this machine's clock."""
    out = []
    for sent, event in events:
        if isinstance(event, Delta | Done):
            out.append((sent, event.text, [(w.text, w.start, w.end) for w in event.words]))
        elif isinstance(event, Interim):
            out.append((sent, event.text, []))
    return out


def probabilities(events: list[tuple[float, object]]) -> list[float]:
    """Each committed word's probability: a pass that reads tokens a decode generated one by
    one rounds them differently in the last digits."""
    return [w.probability for _, event in events if isinstance(event, Delta) for w in event.words]
