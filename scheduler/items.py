"""Audio items on an utterance's token timeline and the O(log n) window lookup."""

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class PlaceholderRange:
    """Positions `[offset, offset + length)` of the timeline that an audio item fills."""

    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length <= 0:
            raise ValueError(f"bad placeholder range offset={self.offset} length={self.length}")

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass
class AudioItem:
    """One chunk of encoder input: where it sits, its identity in the caches, its features.

    `features` always stays the CPU tensor, so moving a copy to the device never needs a
    device -> host copy when the cache offloads it. `arrived_at` (monotonic seconds) is
    when its last sample reached the server: an output's latency is measured from it.
    """

    placeholder: PlaceholderRange
    mm_hash: str
    features: torch.Tensor | None = field(default=None, repr=False)
    arrived_at: float = 0.0

    @property
    def offset(self) -> int:
        return self.placeholder.offset

    @property
    def end(self) -> int:
        return self.placeholder.end

    @property
    def num_embeds(self) -> int:
        return self.placeholder.length


def _item_end(item: AudioItem) -> int:
    return item.placeholder.offset + item.placeholder.length


def _item_offset(item: AudioItem) -> int:
    return item.placeholder.offset


def get_items_in_window(items: list[AudioItem], start: int, end: int) -> tuple[int, int]:
    """Indices `(lo, hi)` of the items that overlap positions `[start, end)`.

    Items are sorted and non-overlapping, so both offsets and ends are sorted:
    `lo` is the first item ending after `start`, `hi` the first starting at or after `end`.
    """
    lo = bisect_right(items, start, key=_item_end)
    hi = bisect_left(items, end, lo=lo, key=_item_offset)
    return lo, max(lo, hi)


def append_item(items: list[AudioItem], item: AudioItem) -> None:
    """Append keeping the timeline sorted and non-overlapping, which the lookup relies on."""
    if items and item.offset < items[-1].end:
        raise ValueError(
            f"audio item {item.placeholder} overlaps or precedes the last item {items[-1].placeholder}"
        )
    items.append(item)
