"""A Voxtral session past 32,768 items: one timeline, fed faster than real time.

Prints one JSON line: what the session held at its largest (referenced encoder rows,
encoder outputs stored, items on the timeline), resident memory sampled along the way,
and seconds per 1,000 positions. Every bound is asserted, as the CI test asserts it
on a shorter session (tests/test_voxtral_long.py):

    .venv/bin/python -m benchmarks.voxtral_long            # 40,000 items, ~4 minutes on 2 cores
"""

import argparse
import json
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from realtime.engine.events import AudioConsumed, Done, Failed
from realtime.engine.loop import Engine
from tests.fixtures.tiny_voxtral import TinyVoxtralSpec, build_tiny_voxtral
from tests.voxtral_harness import pcm16_grid, voxtral_engine, wait_for_release

# The smallest model that still streams like the real one: this is about the engine's
# bookkeeping over tens of thousands of steps, not the model.
LONG_SPEC = TinyVoxtralSpec(
    audio_hidden=16, audio_layers=1, audio_heads=1, audio_window=8,
    text_hidden=16, text_layers=1, text_heads=1, text_window=8,
    left_pad_tokens=4, delay_ms=80,
)  # fmt: skip
FED_AHEAD = 100  # items the client keeps ahead of the engine
RSS_SAMPLES = 10  # resident memory sampled this many times along the session


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


@dataclass
class LongSession:
    done: Done
    sent_samples: int
    num_items: int
    referenced_after_prompt: int = 0  # encoder rows referenced at once, past the prompt
    store: int = 0  # encoder outputs the device worker held at once
    items_held: int = 0  # items on the timeline at once
    rss_mb: list[float] = field(default_factory=list)


def run_long_session(engine: Engine, num_items: int) -> LongSession:
    """Feed one utterance until its timeline holds `num_items` items, staying FED_AHEAD
    items ahead of the engine as a fast client would; step the engine on this thread."""
    runner = engine.runner
    spp = runner.spec.samples_per_position
    # Lead-in silence, client audio and trailing silence fill the timeline exactly.
    padding_items = (runner.spec.leading_silence_samples + runner.trailing_silence_samples(0)) // spp
    total = (num_items - padding_items) * spp
    seconds = pcm16_grid(np.random.default_rng(0).normal(0, 0.1, 10 * 16_000)).reshape(10, 16_000)
    events: list = []
    engine.on_events = lambda batch: events.extend(e for _, e in batch if not isinstance(e, AudioConsumed))
    engine.add_utterance("long")
    engine.run_once()
    request = engine.scheduler.requests["long"]
    referenced = store = items_held = 0
    rss: list[float] = []
    sent, next_sample = 0, 0
    while not (events and isinstance(events[-1], Done | Failed)):
        ahead = (runner.spec.leading_silence_samples + sent) // spp - request.num_computed
        if sent < total and ahead < FED_AHEAD:
            piece = seconds[(sent // 16_000) % 10][: total - sent]
            engine.add_audio("long", piece)
            sent += len(piece)
            if sent == total:
                engine.finish_input("long")
        engine.run_once()
        if request.num_computed > runner.model.num_prompt:
            referenced = max(referenced, engine.scheduler.encoder_cache.num_referenced_rows)
        store = max(store, len(runner.store))
        items_held = max(items_held, len(request.items))
        if request.num_computed >= next_sample:
            rss.append(rss_mb())
            next_sample += num_items // RSS_SAMPLES
    assert isinstance(events[-1], Done), events[-1]
    return LongSession(events[-1], sent, request.num_items, referenced, store, items_held, rss)


def check_long_session(engine: Engine, num_items: int) -> LongSession:
    """No item cap: a session of `num_items` costs per step and in memory what 1,000 cost,
    and leaves nothing behind."""
    session = run_long_session(engine, num_items)
    runner = engine.runner
    assert session.done.audio_seconds == session.sent_samples / 16_000
    # One token per position, from the prompt's last to the timeline's end.
    assert session.done.num_tokens == num_items - runner.model.num_prompt + 1
    assert session.num_items == num_items
    # Referenced encoder rows: one position per step, for each step in flight and the one
    # being scheduled; never the session's length.
    assert session.referenced_after_prompt <= runner.spec.max_steps_in_flight + 1
    assert session.store <= 2 * runner.model.num_prompt
    # The timeline keeps only what is not yet released: about the items fed ahead.
    assert session.items_held <= 2 * FED_AHEAD + 10
    rss = session.rss_mb
    assert len(rss) >= RSS_SAMPLES - 1 and max(rss[2:]) - rss[2] < 20, rss
    wait_for_release(engine)
    cache = engine.scheduler.encoder_cache
    assert cache.refs == {} and cache.input_ids_by_request == {} and cache.num_used_rows == 0
    assert runner.store == {} and runner.num_slots_in_use == 0
    return session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = voxtral_engine(build_tiny_voxtral(Path(tmp) / "ckpt", LONG_SPEC), max_sessions=1)
        started = time.perf_counter()
        session = check_long_session(engine, args.items)
        elapsed = time.perf_counter() - started
    print(
        json.dumps(
            {
                "items": args.items,
                "audio_minutes": round(session.done.audio_seconds / 60, 1),
                "seconds": round(elapsed, 1),
                "seconds_per_1000_positions": round(elapsed / args.items * 1000, 3),
                "referenced_rows_max": session.referenced_after_prompt,
                "store_max": session.store,
                "items_held_max": session.items_held,
                "rss_mb": [round(r) for r in session.rss_mb],
            }
        )
    )


if __name__ == "__main__":
    main()
