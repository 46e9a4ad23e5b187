"""The cells of one stack's KV rings, keys or values, for every layer and slot.

Stored in the model's dtype, or in float8 (e4m3) at half a bfloat16 ring's bytes: the rings,
not the weights, bound the sessions a device holds. A float8 cell keeps a scale per head, the
head's largest magnitude over float8's largest value, so every vector spends float8's whole
range whatever its size; a step reads its cells back in the model's dtype.
"""

import torch

FLOAT8 = torch.float8_e4m3fn
FLOAT8_MAX = torch.finfo(FLOAT8).max


class RingCells:
    def __init__(
        self, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, float8: bool
    ) -> None:
        """`shape`: (layers, slots, heads, cells, head_dim)."""
        self.dtype = dtype
        self.data = torch.zeros(shape, device=device, dtype=FLOAT8 if float8 else dtype)
        # (layers, slots, heads, cells): what each cell's head was divided by to fit float8's range.
        self.scales = torch.ones(shape[:-1], device=device, dtype=dtype) if float8 else None

    @staticmethod
    def bytes_per_cell(heads: int, head_dim: int, dtype: torch.dtype, float8: bool) -> int:
        if float8:
            return heads * (head_dim * FLOAT8.itemsize + dtype.itemsize)
        return heads * head_dim * dtype.itemsize

    def write(self, layer: int, slots: torch.Tensor, cells: torch.Tensor, vectors: torch.Tensor) -> None:
        """`vectors` (N, heads, head_dim) into cell `cells[n]` of slot `slots[n]`."""
        if self.scales is None:
            self.data[layer, slots, :, cells] = vectors
            return
        # The scale as stored: dividing by it and multiplying back by it meet exactly.
        scales = (vectors.abs().amax(-1).float() / FLOAT8_MAX).to(self.dtype)
        safe = scales.float().clamp(min=torch.finfo(torch.float32).tiny)
        scaled = (vectors.float() / safe[..., None]).clamp(-FLOAT8_MAX, FLOAT8_MAX)  # float8 has no infinity
        self.data[layer, slots, :, cells] = scaled.to(FLOAT8)
        self.scales[layer, slots, :, cells] = scales

    def read(self, layer: int, batch: torch.Tensor | slice, width: int) -> torch.Tensor:
        """The first `width` cells of the slots `batch` selects, (B, heads, width, head_dim), in
        the model's dtype: a view where stored so and `batch` is a slice."""
        data = self.data[layer, batch, :, :width]
        if self.scales is None:
            return data
        return data.to(self.dtype) * self.scales[layer, batch, :, :width, None]
