"""Voxtral's KV rings in float8 against rings in the model's dtype: a cell read back is its
vector within float8's rounding, and attention over a wrapping ring is the same attention within
it. The published size's tokens and logits: `benchmarks.voxtral_float8`."""

import torch

from voxtral.voxtral_realtime.ring_cells import FLOAT8_MAX, RingCells
from voxtral.voxtral_realtime.sliding_kv import Rows, SlidingKV
from voxtral.voxtral_realtime.slots import RingShape


def test_a_float8_cell_reads_back_its_vector_within_float8s_rounding(device):
    generator = torch.Generator().manual_seed(0)
    heads, head_dim = 3, 64
    cells = RingCells((1, 2, heads, 8, head_dim), torch.device(device), torch.bfloat16, float8=True)
    # Heads of very different sizes, one all zeros, one far past float8's largest value.
    sizes = torch.tensor([1e-4, 1.0, 3e4])[None, :, None]
    vectors = (torch.randn(4, heads, head_dim, generator=generator) * sizes).to(torch.bfloat16)
    vectors[1, 2] = 0
    slots, at = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 5, 7])
    cells.write(0, slots.to(device), at.to(device), vectors.to(device))
    read = cells.read(0, slice(0, 2), 8).cpu().float()[slots, :, at]
    exact = vectors.float()
    largest = exact.abs().amax(-1, keepdim=True)
    # e4m3 keeps 3 bits of mantissa (half an ulp: 1/16 of a value), and below its smallest
    # normal (2^-6 of its range) steps of 2^-9, each scaled by the head's largest over 448.
    bound = torch.maximum(exact.abs() / 16, largest / FLOAT8_MAX * 2**-10) * 1.05
    assert torch.isfinite(read).all()
    assert ((read - exact).abs() <= bound).all()
    assert (read[1, 2] == 0).all()


def test_attention_over_float8_rings_is_attention_over_the_exact_rings_within_their_rounding(device):
    """A ring that wraps, keys and values of every size a stack makes: each step's attention
    over the float8 cells against the same over cells in the model's dtype."""
    generator = torch.Generator().manual_seed(1)
    ring = RingShape(num_layers=2, num_kv_heads=2, head_dim=64, window=12, max_step=4)
    where = torch.device(device)
    exact, float8 = (SlidingKV(ring, 3, where, torch.bfloat16, float8=f) for f in (False, True))
    errors = []
    for position in range(0, 40, 4):  # three slots, 4 new positions a step: the ring wraps twice
        rows = Rows.build([0, 1, 2], [position] * 3, [4] * 3, where)
        q, k, v = (
            (torch.randn(3, heads, 4, 64, generator=generator) * scale).to(where, torch.bfloat16)
            for heads, scale in ((4, 1.0), (2, 3.0), (2, 0.01 + position))
        )
        steps = exact.begin_step(rows), float8.begin_step(rows)  # a step's cells, for all its layers
        for layer in range(2):
            want = exact.attend(layer, rows, steps[0], q, k, v, 0.125).float()
            got = float8.attend(layer, rows, steps[1], q, k, v, 0.125).float()
            errors.append(float((got - want).norm() / want.norm()))
    # e4m3 rounds a value by up to 1/16 of itself, about 3.6 % root mean square over a binade:
    # an average over such values errs as much. Twice that is no rounding (a lost scale: ~100 %).
    assert max(errors) < 0.1, errors
    assert sum(errors) / len(errors) < 0.06, errors
