"""The Voxtral family in the engine: freeing on abort, the event stream, detokenizing,
features and loading errors."""

import gc
import json
import shutil
import time
import weakref

import huggingface_hub.constants
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mistral_common.tokens.tokenizers.tekken import Tekkenizer
from transformers import AutoProcessor

from realtime.engine.events import Delta, Done, Failed, SpeechStopped, TurnEnded
from tests.conftest import wait_for
from tests.engine_events import listen
from tests.voxtral_harness import (
    Feed,
    drive,
    pcm16_grid,
    pieces,
    reference_text,
    reference_tokens,
    voxtral_engine,
    wait_for_release,
)
from voxtral.errors import WeightsError
from voxtral.loading import load_model
from voxtral.vad import VadConfig
from voxtral.voxtral_realtime.detokenizer import Detokenizer
from voxtral.voxtral_realtime.model import VoxtralModel


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    return pcm16_grid(np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16_000)))


def assert_nothing_held(engine) -> None:
    wait_for_release(engine)
    cache = engine.scheduler.encoder_cache
    assert engine.utterances == {} and engine.scheduler.requests == {}
    assert cache.refs == {} and cache.input_ids_by_request == {} and cache.num_used_rows == 0
    assert engine.runner.store == {}
    assert engine.runner.num_slots_in_use == 0


def test_abort_mid_stream_frees_everything_and_the_other_session_is_unaffected(voxtral_dirs, device):
    path = voxtral_dirs["base"]
    kept_audio = noise(3.0, seed=1)
    engine = voxtral_engine(path, max_sessions=2, device=device)
    kept = Feed(pieces(kept_audio, "80ms"))
    aborted = Feed(pieces(noise(4.0, seed=2), "80ms"))
    feeds = {"kept": kept, "aborted": aborted}
    listen(engine, {u: feed.events for u, feed in feeds.items()})
    for _ in range(30):  # both sessions well into decoding
        for utterance_id, feed in feeds.items():
            if feed.request is None:
                engine.add_utterance(utterance_id)
            else:
                engine.add_audio(utterance_id, feed.pieces.pop(0))
        engine.run_once()
        for utterance_id, feed in feeds.items():
            feed.request = feed.request or engine.scheduler.requests[utterance_id]
    assert len(aborted.request.output_token_ids) > 0
    aborted_request, aborted.request = weakref.ref(aborted.request), None
    engine.abort("aborted")
    del feeds["aborted"]
    drive(engine, feeds)
    assert kept.request.output_token_ids == reference_tokens(path, kept_audio, device=device)
    gc.collect()
    assert aborted_request() is None, "the aborted timeline (items, features) is still held"
    assert_nothing_held(engine)


def test_events_stream_deltas_then_done_while_the_engine_runs_in_its_thread(voxtral_dirs):
    path = voxtral_dirs["short_windows"]
    audio = noise(2.0, seed=3)
    engine = voxtral_engine(path, max_sessions=1)
    events = listen(engine)["s"]
    engine.start()
    try:
        engine.add_utterance("s")
        for piece in pieces(audio, "random", seed=3):
            engine.add_audio("s", piece)
            time.sleep(0.01)  # a client's pace, not a wait
        engine.finish_input("s")
        wait_for(lambda: ended(events))
    finally:
        engine.stop()
    expected = reference_text(path, reference_tokens(path, audio))
    deltas = [e.text for e in events if isinstance(e, Delta)]
    assert isinstance(events[-1], Done) and len(deltas) >= 3
    assert "".join(deltas) == events[-1].text == expected
    assert_nothing_held(engine)


@pytest.fixture(scope="module")
def tekken(voxtral_dirs):
    return Tekkenizer.from_file(voxtral_dirs["base"] / "tekken.json")


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(
        st.one_of(st.integers(0, 40), st.integers(1000, 1255), st.integers(1256, 131_071)), max_size=40
    )
)
def test_detokenizer_equals_decoding_the_whole_list(tekken, tokens):
    """Special tokens (dropped, and they split runs) and raw bytes (split UTF-8 characters)."""
    detokenizer = Detokenizer(tekken)
    text = "".join(detokenizer.add(t) for t in tokens) + detokenizer.flush()
    assert text == tekken.decode(tokens)


def test_item_features_equal_the_feature_extractor(voxtral_dirs, welcome):
    path = voxtral_dirs["fast_frames"]
    model = VoxtralModel(path, *_cpu_float32(), num_slots=1)
    audio = pcm16_grid(welcome[0][:24_000])
    expected = AutoProcessor.from_pretrained(path)(audio, return_tensors="pt")["input_features"][0]
    full = np.concatenate([np.zeros(model.left_pad_samples, np.float32), audio])
    full = np.concatenate([full, np.zeros(model.right_pad_samples(len(audio)), np.float32)])
    spp = model.samples_per_position
    items = [
        model.features(full[i : i + spp], full[max(0, i - 400) : i], full[i + spp : i + spp + 40])
        for i in range(0, len(full), spp)
    ]
    got = np.concatenate(items, axis=1)
    assert got.shape == tuple(expected.shape)
    # float32 rounding only: the extractor runs torch's STFT over the whole signal, we
    # numpy's FFT per item.
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-4)


def _cpu_float32():
    import torch

    return torch.device("cpu"), torch.float32


@pytest.mark.parametrize("missing", ["tekken.json", "model.safetensors", "config.json"])
def test_a_missing_checkpoint_file_is_named(voxtral_dirs, tmp_path, missing):
    broken = tmp_path / "ckpt"
    shutil.copytree(voxtral_dirs["base"], broken)
    (broken / missing).unlink()
    with pytest.raises(WeightsError, match=str(broken / missing)):
        load_model(str(broken), "cpu", max_sessions=1)


def test_a_malformed_config_is_named(voxtral_dirs, tmp_path):
    broken = tmp_path / "ckpt"
    shutil.copytree(voxtral_dirs["base"], broken)
    config = json.loads((broken / "config.json").read_text())
    config["text_config"]["hidden_size"] = "wide"
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="malformed checkpoint"):
        load_model(str(broken), "cpu", max_sessions=1)


def test_a_hugging_face_id_is_looked_up_in_the_local_cache_only(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(WeightsError, match="local Hugging Face cache"):
        load_model("mistralai/Voxtral-Mini-4B-Realtime-2602", "cpu", max_sessions=1)


def test_a_hugging_face_id_in_the_local_cache_loads_without_the_network(voxtral_dirs, tmp_path, monkeypatch):
    """The cache layout huggingface_hub writes: refs/main names the snapshot that holds the files."""
    repo = tmp_path / "models--voxrt--tiny-voxtral"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(voxtral_dirs["short_windows"], repo / "snapshots" / ("0" * 40))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    loaded = load_model("voxrt/tiny-voxtral", "cpu", max_sessions=1)
    assert loaded.runner.spec.name == "voxtral_realtime" and "voxtral" in loaded.names


def ended(events: list) -> bool:
    return bool(events) and isinstance(events[-1], Done | Failed)


def test_a_failed_device_step_fails_its_sessions_frees_them_and_the_engine_carries_on(
    voxtral_dirs, monkeypatch, device
):
    path = voxtral_dirs["base"]
    engine = voxtral_engine(path, max_sessions=2, device=device)
    # The runner's decode of a step's rows, which both paths pass through: on CUDA a steady
    # step replays a graph and never calls the model's decode from Python.
    real_decode = engine.runner._decode
    calls = {"n": 0}

    def decode_failing_once(step, rows):
        calls["n"] += 1
        if calls["n"] == 20:
            raise RuntimeError("device fault")
        return real_decode(step, rows)

    monkeypatch.setattr(engine.runner, "_decode", decode_failing_once)
    audio = noise(2.0, seed=6)
    events = listen(engine)
    engine.start()
    try:
        for utterance_id in ("a", "b"):
            engine.add_utterance(utterance_id)
            engine.add_audio(utterance_id, noise(3.0, seed={"a": 4, "b": 5}[utterance_id]))
        deadline = time.monotonic() + 60
        while not (ended(events["a"]) and ended(events["b"])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert events["a"][-1].code == events["b"][-1].code == "processing_error"
        engine.add_utterance("after")
        engine.add_audio("after", audio)
        engine.finish_input("after")
        while not ended(events["after"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        engine.stop()
    assert isinstance(events["after"][-1], Done)
    assert events["after"][-1].text == reference_text(path, reference_tokens(path, audio, device=device))
    assert_nothing_held(engine)


def test_a_full_slot_pool_refuses_an_utterance_at_once(voxtral_dirs):
    engine = voxtral_engine(voxtral_dirs["base"], max_sessions=1)
    first, second = Feed(pieces(noise(1.0, seed=7), "whole")), Feed([])
    listen(engine, {"first": first.events, "second": second.events})
    engine.add_utterance("first")
    engine.add_utterance("second")
    engine.run_once()  # one step on this thread: a wait for a slot would never return
    assert isinstance(second.events[-1], Failed) and second.events[-1].code == "too_many_sessions"
    first.request = engine.scheduler.requests["first"]  # added already: `drive` only feeds it
    drive(engine, {"first": first})
    assert isinstance(first.events[-1], Done)
    assert_nothing_held(engine)


def test_a_turn_the_vad_ends_ends_with_the_token_its_delay_puts_after_it(voxtral_dirs, welcome):
    """Two spoken turns, each followed by silence: each `SpeechStopped` is followed by one
    `TurnEnded`, at the first token sampled at or past the turn's last position plus
    Voxtral's delay (what the OpenAI wire cuts items at), and before the utterance's `Done`."""
    speech, silent = welcome[0][: 3 * 16_000], np.zeros(2 * 16_000, np.float32)
    engine = voxtral_engine(voxtral_dirs["base"], max_sessions=1)
    runner, feed = engine.runner, Feed(pieces(np.concatenate([speech, silent, speech, silent]), "80ms"))
    turn_ends: list[int] = []  # the position of each turn's last token

    def route(batch: list) -> None:
        for _, event in batch:
            feed.events.append(event)
            if isinstance(event, TurnEnded):
                resolved = [t for t in feed.request.output_token_ids if t != -1]
                turn_ends.append(runner.model.num_prompt - 2 + len(resolved))

    engine.add_utterance("u", VadConfig())  # turns asked for, as by the OpenAI wire's server VAD
    engine.run_once()
    feed.request = engine.scheduler.requests["u"]
    engine.on_events = route
    while not feed.done:
        if feed.pieces:
            engine.add_audio("u", feed.pieces.pop(0))
            if not feed.pieces:
                engine.finish_input("u")
        engine.run_once()
    kinds = [type(e) for e in feed.events if isinstance(e, SpeechStopped | TurnEnded | Done)]
    assert kinds == [SpeechStopped, TurnEnded, SpeechStopped, TurnEnded, Done], kinds
    stops = [e.audio_ms for e in feed.events if isinstance(e, SpeechStopped)]
    for stop_ms, end in zip(stops, turn_ends, strict=True):
        last = (runner.spec.leading_silence_samples + stop_ms * 16) // runner.spec.samples_per_position
        assert end >= last + runner.model.num_delay_tokens - 1, (stop_ms, end)


def test_an_utterance_whose_turns_no_one_reads_skips_the_vad_and_decodes_alike(voxtral_dirs, welcome):
    """vLLM's wire reads no turns, and Voxtral decodes alike whatever the turns: such an
    utterance's audio never reaches the VAD's network, and its tokens are `generate`'s, as are
    those of the same audio whose listener asked for turns."""
    path, audio = voxtral_dirs["base"], welcome[0][: 4 * 16_000]
    expected = reference_tokens(path, audio)
    for vad in (VadConfig(), None):
        engine = voxtral_engine(path, max_sessions=1)
        feed = Feed(pieces(audio, "80ms"), vad=vad)
        drive(engine, {"u": feed})
        assert feed.request.output_token_ids == expected, vad
        assert (engine.stats().vad_calls > 0) == (vad is not None), engine.stats().vad_calls
        assert_nothing_held(engine)
