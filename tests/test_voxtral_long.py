"""A long Voxtral session on one timeline, fed faster than real time: bounded caches, flat
memory, nothing left. The 40,000-item session (past 32,768) is `benchmarks/voxtral_long.py`,
with the same assertions; CI runs one past 8,192 items. Hours into a session, every rotary
angle decodes as at its start."""

import pytest
import torch
from transformers import VoxtralRealtimeConfig
from transformers.models.voxtral_realtime.modeling_voxtral_realtime import VoxtralRealtimeRotaryEmbedding

from benchmarks.voxtral_long import LONG_SPEC, check_long_session
from tests.fixtures.tiny_voxtral import build_tiny_voxtral
from tests.voxtral_harness import Feed, drive, pieces, shift_positions, voxtral_engine
from voxtral.voxtral_realtime.rotary import ExactRotary

pytestmark = pytest.mark.untimed


@pytest.mark.slow
def test_a_session_past_8192_items_completes_with_flat_memory_and_bounded_caches(tmp_path):
    engine = voxtral_engine(build_tiny_voxtral(tmp_path / "ckpt", LONG_SPEC), max_sessions=1)
    session = check_long_session(engine, 8_200)
    assert session.done.audio_seconds > 10 * 60


@pytest.mark.parametrize("checkpoint", ["base", "fast_frames"])
def test_eight_hours_into_a_session_its_speech_decodes_as_at_the_start(voxtral_dirs, welcome, checkpoint):
    """Every rotary angle the encoder and the decoder compute as they would 8 hours into a
    session: the same tokens as from position 0 (float32)."""
    engine, (audio, _) = voxtral_engine(voxtral_dirs[checkpoint], max_sessions=1), welcome

    def tokens(name: str) -> list[int]:
        feed = Feed(pieces(audio, "80ms"))
        drive(engine, {name: feed})
        return feed.request.output_token_ids

    at_start = tokens("start")
    shift_positions(engine.runner.model, 8 * 3600)
    assert len(set(at_start)) >= 8
    assert tokens("hour-8") == at_start


def test_rotary_angles_are_transformers_at_the_start_and_exact_hours_in(voxtral_dirs):
    """The rotation the engine installs: transformers' own near a session's start (to float32's
    rounding of the angle), and the exact one 8 hours of encoder positions in, where
    transformers' float32 product is off by hundredths."""
    config = VoxtralRealtimeConfig.from_pretrained(voxtral_dirs["base"]).audio_config
    theirs = VoxtralRealtimeRotaryEmbedding(config)
    exact = ExactRotary(theirs)
    x = torch.zeros(1, dtype=torch.float32)
    start = torch.arange(0, 512)[None]
    for ours, reference in zip(exact(x, start), theirs(x, start), strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)
    late = start + 8 * 3600 * 50
    angles = late[0, :, None].double() * theirs.inv_freq.double()
    truth = torch.cat((angles, angles), dim=-1).cos().float()
    assert (exact(x, late)[0][0] - truth).abs().max() < 1e-6
    assert (theirs(x, late)[0][0] - truth).abs().max() > 1e-2
