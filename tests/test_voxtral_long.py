"""A Voxtral session past 32,768 items: one timeline, fed faster than real time."""

import resource
import time

import numpy as np
import pytest

from realtime.events import Done, Failed
from tests.fixtures.tiny_voxtral import TinyVoxtralSpec, build_tiny_voxtral
from tests.voxtral_harness import pcm16_grid, voxtral_engine, wait_for_release

# The smallest model that still streams like the real one: the test is about the
# engine's bookkeeping over tens of thousands of steps, not the model.
LONG_SPEC = TinyVoxtralSpec(
    audio_hidden=16, audio_layers=1, audio_heads=1, audio_window=8,
    text_hidden=16, text_layers=1, text_heads=1, text_window=8,
    left_pad_tokens=4, delay_ms=80,
)  # fmt: skip
DEADLINE_SECONDS = 600


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def run_long_session(engine, num_items: int) -> dict:
    """Feed one utterance until its timeline holds `num_items` items, staying ~100 items ahead
    of the engine as a fast client would; step the engine on this thread and watch its state."""
    runner = engine.runner
    spp = runner.samples_per_position
    # Lead-in silence, client audio and trailing silence fill the timeline exactly.
    padding_items = (runner.leading_silence_samples + runner.trailing_silence_samples(0)) // spp
    total = (num_items - padding_items) * spp
    seconds = pcm16_grid(np.random.default_rng(0).normal(0, 0.1, 10 * 16_000)).reshape(10, 16_000)
    events: list = []
    engine.add_utterance("long", events.append)
    engine.run_once()
    request = engine.scheduler.requests["long"]
    watch = {"referenced_after_prompt": 0, "store": 0, "items_held": 0, "rss_mb": []}
    sent, next_sample, deadline = 0, 0, time.monotonic() + DEADLINE_SECONDS
    while not (events and isinstance(events[-1], Done | Failed)):
        assert time.monotonic() < deadline, f"stuck at position {request.num_computed}"
        ahead = (runner.leading_silence_samples + sent) // spp - request.num_computed
        if sent < total and ahead < 100:
            piece = seconds[(sent // 16_000) % 10][: total - sent]
            engine.add_audio("long", piece)
            sent += len(piece)
            if sent == total:
                engine.finish_input("long")
        engine.run_once()
        if request.num_computed > runner.model.num_prompt:
            referenced = engine.scheduler.encoder_cache.num_referenced_rows
            watch["referenced_after_prompt"] = max(watch["referenced_after_prompt"], referenced)
        watch["store"] = max(watch["store"], len(runner.store))
        watch["items_held"] = max(watch["items_held"], len(request.items))
        if request.num_computed >= next_sample:
            watch["rss_mb"].append(rss_mb())
            next_sample += 5_000
    assert isinstance(events[-1], Done), events[-1]
    watch.update(done=events[-1], sent=sent, request=request)
    return watch


def assert_nothing_left(engine) -> None:
    wait_for_release(engine)
    cache = engine.scheduler.encoder_cache
    assert cache.refs == {} and cache.input_ids_by_request == {} and cache.num_used_rows == 0
    assert engine.runner.store == {} and engine.runner.num_slots_in_use == 0


@pytest.fixture
def long_engine(tmp_path):
    return voxtral_engine(build_tiny_voxtral(tmp_path / "ckpt", LONG_SPEC), max_sessions=1)


@pytest.mark.slow
def test_a_session_past_32768_items_completes_with_flat_memory_and_bounded_caches(long_engine):
    """No item cap: 40,000 items (53 minutes) cost per step and in memory what 1,000 cost."""
    watch = run_long_session(long_engine, 40_000)
    runner = long_engine.runner
    done: Done = watch["done"]
    assert done.audio_seconds == watch["sent"] / 16_000 > 50 * 60
    # One token per position, from the prompt's last to position 39,999.
    assert done.num_tokens == 40_000 - runner.model.num_prompt + 1
    assert watch["request"].num_items == 40_000
    # Referenced encoder rows: one position per step, for each step in flight and the one
    # being scheduled; never the session's length.
    assert watch["referenced_after_prompt"] <= runner.max_steps_in_flight + 1
    assert watch["store"] <= 2 * runner.model.num_prompt
    # The timeline keeps only what is not yet released: about the 100 items fed ahead.
    assert watch["items_held"] <= 2 * 100 + 10
    rss = watch["rss_mb"]
    assert len(rss) >= 8 and max(rss[2:]) - rss[2] < 20, rss
    assert_nothing_left(long_engine)
