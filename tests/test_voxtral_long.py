"""A long Voxtral session on one timeline, fed faster than real time: bounded caches, flat
memory, nothing left. The 40,000-item session (past 32,768) is `benchmarks/voxtral_long.py`,
with the same assertions; CI runs one past 8,192 items."""

import pytest

from benchmarks.voxtral_long import LONG_SPEC, check_long_session
from tests.fixtures.tiny_voxtral import build_tiny_voxtral
from tests.voxtral_harness import voxtral_engine


@pytest.mark.slow
def test_a_session_past_8192_items_completes_with_flat_memory_and_bounded_caches(tmp_path):
    engine = voxtral_engine(build_tiny_voxtral(tmp_path / "ckpt", LONG_SPEC), max_sessions=1)
    session = check_long_session(engine, 8_200)
    assert session.done.audio_seconds > 10 * 60
