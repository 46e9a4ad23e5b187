"""A 43-minute Voxtral session: 32,768 items on one timeline, fed faster than real time."""

import time

import numpy as np
import pytest

from realtime.engine import MAX_ITEMS_PER_SESSION, Done, Failed
from tests.voxtral_harness import pcm16_grid, voxtral_engine
from voxtral.tiny_voxtral import TinyVoxtralSpec, build_tiny_voxtral

# The smallest model that still streams like the real one: the test is about the
# engine's bookkeeping over 32K steps, not the model.
LONG_SPEC = TinyVoxtralSpec(
    audio_hidden=16, audio_layers=1, audio_heads=1, audio_window=8,
    text_hidden=16, text_layers=1, text_heads=1, text_window=8,
    left_pad_tokens=4, delay_ms=80,
)  # fmt: skip


@pytest.mark.slow
def test_a_32768_item_session_completes_with_bounded_caches(tmp_path):
    engine = voxtral_engine(build_tiny_voxtral(tmp_path / "long", LONG_SPEC), max_sessions=1)
    runner = engine.runner
    spp = runner.samples_per_position
    # Lead-in silence, client audio and trailing silence fill the timeline exactly.
    padding_items = (runner.leading_silence_samples + runner.trailing_silence_samples(0)) // spp
    client_items = MAX_ITEMS_PER_SESSION - padding_items
    total = client_items * spp
    seconds = pcm16_grid(np.random.default_rng(0).normal(0, 0.1, 10 * 16_000)).reshape(10, 16_000)
    events: list = []
    engine.start()
    try:
        engine.add_session("long", events.append)
        peak_rows = peak_store = peak_with_features = sent = 0
        while not (events and isinstance(events[-1], Done | Failed)):
            request = engine.scheduler.requests.get("long")
            # Stay a few seconds ahead of the engine, as a fast client would (counting what
            # was sent: queued audio is not on the timeline yet).
            ahead = (runner.leading_silence_samples + sent) // spp - request.num_computed if request else 0
            if request is not None and sent < total and ahead < 100:
                piece = seconds[(sent // 16_000) % 10][: total - sent]
                engine.add_audio("long", piece)
                sent += len(piece)
                if sent == total:
                    engine.finish_input("long")
            if request is not None:
                peak_rows = max(peak_rows, engine.stats().encoder_cache_resident_rows)
                peak_store = max(peak_store, len(runner.store))
                # Features are dropped in order as positions are computed: the tail tells.
                with_features = sum(item.features is not None for item in request.items[-1_000:])
                peak_with_features = max(peak_with_features, with_features)
            time.sleep(0.002)
        assert isinstance(events[-1], Done), events[-1]
    finally:
        engine.stop()
    done: Done = events[-1]
    assert done.audio_seconds == total / 16_000 > 40 * 60
    # One token per position, from the prompt's last to position 32,767.
    assert done.num_tokens == MAX_ITEMS_PER_SESSION - runner.model.num_prompt + 1
    # Bounded throughout: one step's worth of encoder rows, not the session's length.
    assert peak_rows <= engine.scheduler.config.encoder_cache_rows
    assert peak_store <= 2 * runner.model.num_prompt
    assert peak_with_features < 200
    runner.wait_idle()
    cache = engine.scheduler.encoder_cache
    assert cache.refs == {} and cache.input_ids_by_request == {} and cache.num_used_rows == 0
    assert runner.store == {} and engine.stats().kv_slots_used == 0
