"""Windows shared out among lanes (each decoded alone, on a thread of its own) say what the same
windows decoded together in one batch say: the lanes change when text comes, not what."""

from benchmarks.real_speech import recording
from realtime.engine import Engine
from realtime.events import Delta
from tests.test_whisper_streaming import stream_through_engine
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.runner import WhisperRunner

SESSIONS = {"beckett": (0, 10), "two_cities": (0, 14), "endgame_nagg_nell": (4, 18)}  # seconds of each


def test_two_lanes_say_what_one_batch_of_the_same_windows_says(whisper_model):
    audios = {
        name: recording(name).audio[start * SAMPLE_RATE : stop * SAMPLE_RATE]
        for name, (start, stop) in SESSIONS.items()
    }
    lanes = WhisperRunner(whisper_model, lanes=2)
    assert lanes.policy.max_windows_per_step == 1  # a window per lane and step
    batched = WhisperRunner(whisper_model, WhisperPolicy(max_windows_per_step=2))
    by_lanes = stream_through_engine(Engine(lanes), audios)
    by_batch = stream_through_engine(Engine(batched), audios)
    for name in audios:
        said = [e.text for e in by_lanes[name] if isinstance(e, Delta)]
        assert len(said) > 3, "each session must say something"
        assert [texts(e) for e in by_lanes[name]] == [texts(e) for e in by_batch[name]]
    # One window a step decodes others' windows later, and so other windows: the lanes did
    # decode two windows a step.
    one_by_one = stream_through_engine(Engine(WhisperRunner(whisper_model)), audios)
    assert any([texts(e) for e in by_lanes[n]] != [texts(e) for e in one_by_one[n]] for n in audios)


def texts(event: object) -> tuple:
    """An event, without the latency its own clock measured."""
    return (type(event).__name__, getattr(event, "text", None))
