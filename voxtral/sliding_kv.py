"""Per-session ring buffers for sliding-window attention, and one batched attention call over them.

A session owns a slot; a slot holds, for every layer, the keys and values of its last
`window` positions and which absolute position each ring cell holds. Memory is fixed
by the number of slots: it does not grow with session length or sessions served.
"""

import torch
import torch.nn.functional as F


class SlidingKV:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        window: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.window = window
        shape = (num_layers, num_slots, num_kv_heads, window, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.positions = torch.full((num_slots, window), -1, device=device, dtype=torch.long)

    def reset(self, slots: torch.Tensor) -> None:
        self.positions[slots] = -1

    def mask(self, slots: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        """(B, 1, Q, window + Q) boolean: key k is visible to query q iff q - window < k <= q.

        Keys are the slot's ring followed by this step's new positions. Padded queries sit
        after a row's real ones at later positions, so no real query ever sees them.
        """
        key_pos = torch.cat([self.positions[slots], q_pos], dim=1)[:, None, :]
        query = q_pos[:, :, None]
        visible = (key_pos >= 0) & (key_pos <= query) & (key_pos > query - self.window)
        return visible[:, None]

    def attend(
        self,
        layer: int,
        slots: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """q (B, H, Q, D) and this step's k, v (B, KVH, Q, D), all rotated; returns (B, H, Q, D)."""
        keys = torch.cat([self.keys[layer, slots], k], dim=2)
        values = torch.cat([self.values[layer, slots], v], dim=2)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)

    def write(
        self, layer: int, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor, cells, k, v
    ) -> None:
        """Store the kept new keys: `rows`/`cols` index the step's (B, Q) grid, `cells` the ring."""
        self.keys[layer, slots[rows], :, cells] = k.transpose(1, 2)[rows, cols]
        self.values[layer, slots[rows], :, cells] = v.transpose(1, 2)[rows, cols]

    def kept(
        self, q_pos: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Which new positions the ring keeps: the valid ones among each row's last `window`."""
        last = torch.where(valid, q_pos, -1).max(dim=1, keepdim=True).values
        keep = valid & (q_pos > last - self.window)
        rows, cols = keep.nonzero(as_tuple=True)
        return rows, cols, q_pos[rows, cols] % self.window

    def advance(self, slots: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, cells, q_pos) -> None:
        """After every layer has written: the ring cells now hold these positions."""
        self.positions[slots[rows], cells] = q_pos[rows, cols]
