"""Ring-buffer attention against a plain reference: every key kept, the window applied by hand."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from voxtral.voxtral_realtime.sliding_kv import Rows, SlidingKV
from voxtral.voxtral_realtime.slots import RingShape

CPU = torch.device("cpu")
SLOTS, HEADS, KV_HEADS, DIM, MAX_STEP = 3, 2, 1, 4, 5


@settings(max_examples=80, deadline=None)
@given(
    window=st.integers(1, 7),
    # Per step, how many new positions each slot brings (0: not in this step's batch), so
    # batches are packed ([0, 1, 2], [1, 2]: attention reads the rings in place) or not ([0, 2]).
    steps=st.lists(st.lists(st.integers(0, MAX_STEP), min_size=SLOTS, max_size=SLOTS), max_size=14),
    seed=st.integers(0, 2**16),
)
def test_ring_attention_equals_full_history_sliding_window(window, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    kv = SlidingKV(RingShape(1, KV_HEADS, DIM, window, MAX_STEP), SLOTS, CPU, torch.float64)
    keys: dict[int, list[torch.Tensor]] = {slot: [] for slot in range(SLOTS)}
    values: dict[int, list[torch.Tensor]] = {slot: [] for slot in range(SLOTS)}
    for counts in steps:
        slots = [slot for slot in range(SLOTS) if counts[slot]]
        if not slots:
            continue
        lengths = [counts[slot] for slot in slots]
        starts = [len(keys[slot]) for slot in slots]
        rows = Rows.build(slots, starts, lengths, CPU)
        width = max(lengths)
        q = torch.randn(len(slots), HEADS, width, DIM, generator=generator, dtype=torch.float64)
        k = torch.randn(len(slots), KV_HEADS, width, DIM, generator=generator, dtype=torch.float64)
        v = torch.randn(len(slots), KV_HEADS, width, DIM, generator=generator, dtype=torch.float64)
        out = kv.attend(0, rows, kv.begin_step(rows), q, k, v, scale=0.5)
        for b, slot in enumerate(slots):
            for j in range(lengths[b]):
                keys[slot].append(k[b, 0, j])
                values[slot].append(v[b, 0, j])
            for j in range(lengths[b]):
                position = starts[b] + j
                visible = range(max(0, position - window + 1), position + 1)
                ref_k = torch.stack([keys[slot][p] for p in visible])
                ref_v = torch.stack([values[slot][p] for p in visible])
                weights = torch.softmax(q[b, :, j] @ ref_k.T * 0.5, dim=-1)
                torch.testing.assert_close(out[b, :, j], weights @ ref_v)
