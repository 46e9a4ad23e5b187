"""Windows shared out among lanes (each lane's share in one batch, on a thread of its own) say what
the same windows decoded together in one batch say: the lanes change when text comes, not what."""

import threading

import numpy as np
import pytest

from benchmarks.conversation_set import phone_call
from benchmarks.real_speech import recording
from benchmarks.text import whisper_wer
from realtime.engine.events import Delta, Done
from realtime.engine.loop import Engine
from tests.engine_events import listen
from tests.test_whisper_streaming import stream_through_engine
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.runner import WhisperRunner
from voxtral.whisper.stream import POSITIONS_PER_SECOND

pytestmark = pytest.mark.untimed

SESSIONS = {"beckett": (0, 10), "two_cities": (0, 14), "endgame_nagg_nell": (4, 18)}  # seconds of each


def session_audios(sessions: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    """Each session's seconds of its recording; a name ending "_later" reads its recording again."""
    return {
        name: recording(name.removesuffix("_later")).audio[start * SAMPLE_RATE : stop * SAMPLE_RATE]
        for name, (start, stop) in sessions.items()
    }


def test_two_lanes_say_what_one_batch_of_the_same_windows_says(whisper_model):
    audios = session_audios(SESSIONS)
    lanes = WhisperRunner(whisper_model, lanes=2)
    per_step = lanes.spec.lanes * lanes.policy.max_windows_per_step  # windows a step decodes on the lanes
    threads: set[str] = set()
    decode_lane = lanes.decoder.decode_lane

    def recorded(windows):
        threads.add(threading.current_thread().name)
        return decode_lane(windows)

    lanes.decoder.decode_lane = recorded
    batched = WhisperRunner(whisper_model, WhisperPolicy(max_windows_per_step=per_step))
    by_lanes = stream_through_engine(Engine(lanes), audios)
    by_batch = stream_through_engine(Engine(batched), audios)
    for name in audios:
        said = [e.text for e in by_lanes[name] if isinstance(e, Delta)]
        assert len(said) > 3, "each session must say something"
        assert [texts(e) for e in by_lanes[name]] == [texts(e) for e in by_batch[name]]
    assert len(threads) > 1, "both lanes decoded windows"


def texts(event: object) -> tuple:
    """An event, without the latency its own clock measured."""
    return (type(event).__name__, getattr(event, "text", None))


def test_a_step_decodes_no_more_windows_than_its_room_turns_that_ended_among_them(whisper_model):
    """A turn that ended takes room in the step as a window going on does, so a lane's share
    of a step, and the wait of the words that end a turn, stay bounded however many sessions
    are due. Only turns that ended may fill a step past its room: they never wait."""
    audios = session_audios({**SESSIONS, "two_cities_later": (14, 30)})
    runner = WhisperRunner(whisper_model)
    room = runner.policy.max_windows_per_step * runner.spec.lanes
    steps: list[list[bool]] = []  # per decode, whether each window commits a turn whole
    decode = runner.decoder.decode

    def recorded(windows):
        steps.append([w.commit_all for w in windows])
        return decode(windows)

    runner.decoder.decode = recorded
    stream_through_engine(Engine(runner), audios)
    assert all(len(s) <= room or all(s) for s in steps), steps
    assert any(len(s) == room and any(s) and not all(s) for s in steps), "ended turns shared a full step"


def test_a_turn_handed_over_whole_is_heard_and_its_pieces_joined_read_as_one_decode(whisper_model):
    """A real call's turn in one window, as a client faster than real time hands it over: tiny.en
    loops on its opening ("Hello? Hello? Oh, hello.") where the whole window is decoded at once,
    and the window is decoded again in pieces (`WindowDecoder._whole`). What it delivers says
    the call, and reads as one decode of the window would: its tokens make its segments, in
    order inside the window, with a frame and a log-probability per generated token."""
    call = phone_call()
    runner = WhisperRunner(whisper_model)
    delivered = []
    deliver = runner._deliver

    def recorded(window, hyp, result):
        delivered.append((window, hyp))
        deliver(window, hyp, result)

    runner._deliver = recorded
    engine = Engine(runner)
    events = listen(engine)
    engine.add_utterance("call")
    engine.add_audio("call", call.audio)
    engine.finish_input("call")
    while not any(isinstance(e, Done) for e in events["call"]):
        engine.run_once()
    assert whisper_wer(call.text, events["call"][-1].text) <= 0.35, events["call"][-1].text
    for window, hyp in delivered:
        seconds = window.raw.shape[1] / POSITIONS_PER_SECOND
        again = whisper_model.segments(hyp.token_ids)
        assert [s.text for s in again] == [s.text for s in hyp.segments]
        for mine, read in zip(hyp.segments, again, strict=True):
            assert mine.start == pytest.approx(read.start, abs=0.021)
            assert mine.end is None or mine.end == pytest.approx(read.end, abs=0.021)
            assert 0 <= mine.start <= (mine.end or seconds) <= seconds + 0.01
        starts = [s.start for s in hyp.segments]
        assert starts == sorted(starts)
        assert len(hyp.frames) == len(hyp.logprobs) == len(hyp.token_ids) - hyp.num_forced
