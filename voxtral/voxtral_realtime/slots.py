"""How many sessions' KV rings fit in the device's free memory.

A slot holds, per session, every layer's ring of keys and values at the model's real
windows: at Voxtral Mini 4B Realtime's size about 1.1 GB in bfloat16, so the default
`--max-sessions` (64) would ask for 70 GB. The rings are allocated once, at start.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch

from voxtral.errors import WeightsError
from voxtral.voxtral_realtime.ring_cells import RingCells

log = structlog.get_logger(__name__)

# Share of the free memory the rings may take: steps need room for activations too.
RING_SHARE = 0.8


@dataclass(frozen=True)
class RingShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    window: int
    max_step: int  # the most new positions a step writes

    @property
    def cells(self) -> int:
        """A step writes before it attends: the ring keeps `max_step - 1` cells past the window."""
        return self.window + self.max_step - 1

    def slot_bytes(self, dtype: torch.dtype, float8: bool = False) -> int:
        cells = self.cells + 1  # and the spare cell a steady step's idle rows write to (`SlidingKV`)
        cell = RingCells.bytes_per_cell(self.num_kv_heads, self.head_dim, dtype, float8)
        per_layer = 2 * cells * cell  # keys and values
        return self.num_layers * per_layer + cells * torch.long.itemsize  # and each cell's position


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file() and (found := re.search(r"MemAvailable:\s+(\d+) kB", meminfo.read_text())):
        return int(found.group(1)) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def slots_that_fit(requested: int, slot_bytes: int, free: int) -> int:
    """`requested`, or as many as `RING_SHARE` of `free` holds; at least one, or an error."""
    fit = int(free * RING_SHARE) // slot_bytes
    if fit < 1:
        raise WeightsError(
            f"one session's KV rings need {slot_bytes / 2**20:,.0f} MiB and only "
            f"{free / 2**20:,.0f} MiB is free"
        )
    if fit < requested:
        log.warning(
            "voxtral.kv_slots_limited", requested=requested, slots=fit, mib_per_slot=round(slot_bytes / 2**20)
        )
    return min(requested, fit)
