"""An upload runs in the same engine as live speech, after it: its positions come after every
live utterance's (tests/test_scheduler.py), and its windows decode on a lane of their own,
one at a time, beside the live steps: a live window never waits for an upload's."""

import threading
from concurrent.futures import wait

import numpy as np

from benchmarks.real_speech import recording
from benchmarks.text import word_error_rate
from realtime.engine.events import Done
from realtime.engine.loop import Engine
from scheduler import RequestKind
from tests.engine_events import listen

CHUNK = 1600  # 100 ms, as a live client sends
UPLOAD_CHUNK = 16000  # a second, as the server hands an upload over


def upload_audio() -> np.ndarray:
    """72 s of two recordings: long enough to be decoded while the live session speaks."""
    return np.concatenate([recording("two_cities").audio, recording("endgame_nagg_nell").audio])


def alone_text(runner, audio: np.ndarray) -> str:
    """The reference: `audio` handed over at once as live speech, each turn decoded whole on
    the engine thread."""
    engine = Engine(runner)
    events = listen(engine)
    engine.add_utterance("alone")
    engine.add_audio("alone", audio)
    engine.finish_input("alone")
    run_to_the_end(engine)
    return done_text(events["alone"])


def done_text(events: list) -> str:
    return next(e.text for e in events if isinstance(e, Done))


def uploads_decoded(engine: Engine) -> None:
    """Until the upload lane's windows in decoding are done: the step after delivers them."""
    wait([decoding.hypothesis for decoding in list(engine.runner.uploading.values())])


def run_to_the_end(engine: Engine) -> None:
    """Steps until every utterance is done; a step that finds an upload's window in decoding
    waits for it, where the engine's own loop would step on beside it."""
    engine.run_once()
    while engine.utterances:
        uploads_decoded(engine)
        engine.run_once()


def test_uploads_decode_beside_live_speech_a_window_at_a_time(whisper_runner, welcome, monkeypatch):
    """Two uploads at once, a second at a time, the live speech's 100 ms chunks between: the
    upload lane, one window at a time, decodes each turn whole, into the words each upload
    alone decoded on the engine thread gives."""
    samples, text = welcome
    uploads = {"upload": upload_audio(), "second": recording("beckett").audio}
    alone = {name: alone_text(whisper_runner, audio) for name, audio in uploads.items()}

    engine = Engine(whisper_runner)
    events = listen(engine)
    decodes: list[tuple[str, list[RequestKind]]] = []  # (thread, kinds) of each lane's batch
    at_once, most_at_once, lock = 0, 0, threading.Lock()
    decode_lane = whisper_runner.decoder.decode_lane

    def recorded(windows):
        nonlocal at_once, most_at_once
        uploads = sum(1 for w in windows if w.request.kind is RequestKind.UPLOAD)
        with lock:
            at_once += uploads
            most_at_once = max(most_at_once, at_once)
        decodes.append((threading.current_thread().name, [w.request.kind for w in windows]))
        try:
            return decode_lane(windows)
        finally:
            with lock:
                at_once -= uploads

    monkeypatch.setattr(whisper_runner.decoder, "decode_lane", recorded)
    for name in uploads:
        engine.add_utterance(name, kind=RequestKind.UPLOAD)
    engine.add_utterance("live")
    # The uploads a second at a time, as the server hands them over, with the live speech's
    # 100 ms chunks between.
    uploaded = 0
    for offset in range(0, len(samples), CHUNK):
        if offset % UPLOAD_CHUNK == 0:
            for name, audio in uploads.items():
                engine.add_audio(name, audio[uploaded : uploaded + UPLOAD_CHUNK])
            uploaded += UPLOAD_CHUNK
        engine.add_audio("live", samples[offset : offset + CHUNK])
        engine.run_once()
    engine.finish_input("live")
    for rest in range(uploaded, max(len(a) for a in uploads.values()), UPLOAD_CHUNK):
        for name, audio in uploads.items():
            if rest < len(audio):
                engine.add_audio(name, audio[rest : rest + UPLOAD_CHUNK])
        engine.run_once()
        uploads_decoded(engine)
    for name in uploads:
        engine.finish_input(name)
    run_to_the_end(engine)

    assert word_error_rate(text, done_text(events["live"])) <= 0.1
    assert {name: done_text(events[name]) for name in uploads} == alone
    upload_decodes = [(thread, kinds) for thread, kinds in decodes if RequestKind.UPLOAD in kinds]
    assert upload_decodes and any(RequestKind.LIVE in kinds for _, kinds in decodes)
    on_the_upload_lane = [thread.startswith("voxrt-upload") for thread, _ in upload_decodes]
    assert all(on_the_upload_lane) and all(kinds == [RequestKind.UPLOAD] for _, kinds in upload_decodes)
    assert most_at_once == 1
