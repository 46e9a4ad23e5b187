"""Per-utterance ring buffers for sliding-window attention, and one batched attention call over them.

An utterance owns a slot; a slot holds, for every layer, the keys and values of its recent
positions and which absolute position each ring cell holds. Memory is fixed by the
number of slots: it does not grow with an utterance's length or with utterances served.

A step writes its new keys into the ring first and then attends over the ring alone
(no concatenation). That is safe because the ring has `window + max_step - 1` cells:
the keys a step overwrites are older than anything its earliest query still sees.

A steady step (`Rows.steady`) runs a fixed batch, slots 0..B-1 one position each, so that its
shapes repeat and a CUDA graph can replay it; a slot idle in it writes to a spare cell past
the ring, which no query reads, and keeps the state it carries.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from voxtral.voxtral_realtime.ring_cells import RingCells
from voxtral.voxtral_realtime.slots import RingShape


@dataclass
class Rows:
    """One step's batch: row b is an utterance's new positions `[start, start + length)`, padded to Q."""

    slots: torch.Tensor  # (B,)
    positions: torch.Tensor  # (B, Q) absolute; padding continues past a row's last position
    valid: torch.Tensor  # (B, Q)
    lengths: torch.Tensor  # (B,)
    flat_rows: torch.Tensor  # (N,) row of each real entry
    flat_cols: torch.Tensor  # (N,) column of each real entry
    end: int  # at least 1 + the largest real position: how much of a young ring is in use
    first_slot: int | None  # set when the rows' slots are first_slot, first_slot + 1, ...: no gather
    active: torch.Tensor | None = None  # (B,) a steady step's rows that run; None: every row

    @classmethod
    def build(cls, slots: list[int], starts: list[int], lengths: list[int], device: torch.device) -> "Rows":
        """Built with numpy from host lists: no device wait, and no torch thread pool on the host."""
        counts = np.asarray(lengths)
        offsets = np.arange(counts.max())
        arrays = (
            np.asarray(slots),
            np.asarray(starts)[:, None] + offsets,
            offsets < counts[:, None],
            counts,
            np.repeat(np.arange(len(counts)), counts),
            np.concatenate([np.arange(n) for n in lengths]),
        )
        end = max(s + n for s, n in zip(starts, lengths, strict=True))
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        tensors = (torch.from_numpy(a).to(device, non_blocking=True) for a in arrays)
        return cls(*tensors, end=end, first_slot=slots[0] if contiguous else None)

    @classmethod
    def steady(cls, starts: torch.Tensor, active: torch.Tensor, per_row: int, end: int) -> "Rows":
        """Slots 0..B-1, `per_row` positions each from `starts` (B,), built on the device from
        the two tensors alone: a captured step reads them from its buffers at every replay."""
        device = starts.device
        offsets = torch.arange(per_row, device=device)
        slots = torch.arange(len(starts), device=device)
        return cls(
            slots=slots,
            positions=starts[:, None] + offsets,
            valid=active[:, None].expand(-1, per_row),
            lengths=torch.full_like(slots, per_row),
            flat_rows=slots[:, None].expand(-1, per_row).reshape(-1),  # (no repeat_interleave: it can sync)
            flat_cols=offsets.repeat(len(starts)),
            end=end,
            first_slot=0,
            active=active,
        )


@dataclass
class StepMask:
    mask: torch.Tensor  # (B, 1, Q, width): which ring cells each query sees
    width: int
    cells: torch.Tensor  # (N,) ring cell of each real entry


class SlidingKV:
    def __init__(
        self, ring: RingShape, num_slots: int, device: torch.device, dtype: torch.dtype, float8: bool = False
    ) -> None:
        """`float8`: the cells stored in float8 with a scale per head (`RingCells`)."""
        self.window = ring.window
        self.capacity = ring.cells
        self.spare = ring.cells  # the cell past the ring where a steady step's idle rows write
        shape = (ring.num_layers, num_slots, ring.num_kv_heads, ring.cells + 1, ring.head_dim)
        self.keys = RingCells(shape, device, dtype, float8)
        self.values = RingCells(shape, device, dtype, float8)
        self.positions = torch.full((num_slots, ring.cells + 1), -1, device=device, dtype=torch.long)

    def reset(self, slots: torch.Tensor) -> None:
        self.positions[slots] = -1

    def begin_step(self, rows: Rows) -> StepMask:
        """Claim ring cells for the step's positions; key k is visible to query q iff q - window < k <= q."""
        flat_positions = rows.positions[rows.flat_rows, rows.flat_cols]
        cells = flat_positions % self.capacity
        if rows.active is not None:
            runs = rows.active[rows.flat_rows]
            cells = torch.where(runs, cells, self.spare)
            flat_positions = torch.where(runs, flat_positions, -1)
        self.positions[rows.slots[rows.flat_rows], cells] = flat_positions
        width = min(self.capacity, rows.end)
        key_pos = self.positions[rows.slots, :width][:, None, :]
        query = rows.positions[:, :, None]
        visible = (key_pos >= 0) & (key_pos <= query) & (key_pos > query - self.window)
        # Padding queries see every cell: their output is dropped, but must stay finite.
        visible |= ~rows.valid[:, :, None]
        return StepMask(visible[:, None], width, cells)

    def attend(
        self,
        layer: int,
        rows: Rows,
        step: StepMask,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """q (B, H, Q, D) and this step's k, v (B, KVH, Q, D), all rotated; returns (B, H, Q, D)."""
        slots = rows.slots[rows.flat_rows]
        self.keys.write(layer, slots, step.cells, k.transpose(1, 2)[rows.flat_rows, rows.flat_cols])
        self.values.write(layer, slots, step.cells, v.transpose(1, 2)[rows.flat_rows, rows.flat_cols])
        # A gather copies every row's ring; consecutive slots are a view of the rings in place.
        batch: torch.Tensor | slice = rows.slots
        if rows.first_slot is not None:
            batch = slice(rows.first_slot, rows.first_slot + len(rows.lengths))
        keys = self.keys.read(layer, batch, step.width)
        values = self.values.read(layer, batch, step.width)
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=step.mask, scale=scale, enable_gqa=True
        )
