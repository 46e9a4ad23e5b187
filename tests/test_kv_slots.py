"""Sessions' KV rings at Voxtral's real windows, and how many of them a device holds."""

import pytest
import torch
from transformers import VoxtralRealtimeConfig

from voxtral.errors import WeightsError
from voxtral.loading import load_model
from voxtral.voxtral_realtime.slots import RING_SHARE, RingShape, slots_that_fit

PROMPT = 39  # BOS + 32 left-pad + 6 delay tokens: the published model's streaming prompt


def real_size_rings() -> tuple[RingShape, RingShape]:
    """The encoder's and the decoder's rings at transformers' VoxtralRealtimeConfig defaults,
    which are Voxtral Mini 4B Realtime's sizes."""
    config = VoxtralRealtimeConfig()
    audio, text = config.audio_config, config.text_config
    audio_ring = RingShape(
        audio.num_hidden_layers, audio.num_attention_heads, audio.head_dim, audio.sliding_window, PROMPT * 4
    )
    text_ring = RingShape(
        text.num_hidden_layers, text.num_key_value_heads, text.head_dim, text.sliding_window, PROMPT
    )
    return audio_ring, text_ring


def test_a_real_size_slot_takes_a_gigabyte_and_the_default_sessions_do_not_fit_a_gpu():
    audio_ring, text_ring = real_size_rings()
    per_slot = audio_ring.slot_bytes(torch.bfloat16) + text_ring.slot_bytes(torch.bfloat16)
    # Plain reference: 26 layers x (K, V) x 8 heads x (8192 + 38 + 1 spare) cells x 128 x 2 bytes,
    # and the encoder's 32 x 2 x 32 x (750 + 155 + 1) x 64 x 2, plus one int64 position per cell.
    assert per_slot == 26 * 2 * 8 * 8231 * 128 * 2 + 32 * 2 * 32 * 906 * 64 * 2 + (8231 + 906) * 8
    assert 1.0e9 < per_slot < 1.2e9
    free = 70 * 2**30  # an 80 GB GPU holding the 8.8 GB of weights
    assert slots_that_fit(64, per_slot, free) == int(free * RING_SHARE) // per_slot < 64
    assert slots_that_fit(8, per_slot, free) == 8
    with pytest.raises(WeightsError, match=r"need 1,0\d\d MiB and only 512 MiB is free"):
        slots_that_fit(1, per_slot, 2**29)


@pytest.mark.parametrize("float8_rings", [False, True])
def test_the_loaded_model_counts_its_rings_as_allocated(voxtral_dirs, float8_rings):
    loaded = load_model(str(voxtral_dirs["base"]), "cpu", "bfloat16", 3, float8_rings=float8_rings)
    model = loaded.runner.model
    cells = [c for kv in (model.audio_kv, model.text_kv) for c in (kv.keys, kv.values)]
    held = [c.data for c in cells] + [c.scales for c in cells if c.scales is not None]
    allocated = sum(t.nbytes for t in held) + model.audio_kv.positions.nbytes + model.text_kv.positions.nbytes
    assert loaded.max_sessions == model.num_slots == 3
    assert model.slot_bytes * 3 == allocated


def test_float8_rings_take_about_half_a_real_size_slot():
    audio_ring, text_ring = real_size_rings()
    plain = sum(ring.slot_bytes(torch.bfloat16) for ring in (audio_ring, text_ring))
    float8 = sum(ring.slot_bytes(torch.bfloat16, float8=True) for ring in (audio_ring, text_ring))
    # Plain reference: a byte a value, and a bfloat16 scale per cell and head.
    assert float8 == 26 * 2 * 8 * 8231 * (128 + 2) + 32 * 2 * 32 * 906 * (64 + 2) + (8231 + 906) * 8
    assert 0.5 < float8 / plain < 0.53


def test_float8_is_refused_for_a_model_that_keeps_no_rings():
    with pytest.raises(WeightsError, match="only Voxtral Realtime keeps KV rings"):
        load_model(None, "cpu", float8_rings=True)
