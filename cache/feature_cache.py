"""Preprocessed features (log-mel) by content hash, least-recently-used, bounded in bytes."""

from collections import OrderedDict
from collections.abc import Callable

import torch


def _nbytes(features: torch.Tensor) -> int:
    return features.element_size() * features.nelement()


class FeatureCache:
    """`queries` and `hits` count every lookup."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.num_bytes = 0
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, mm_hash: str) -> bool:
        return mm_hash in self.entries

    def _lookup(self, mm_hash: str) -> torch.Tensor | None:
        self.queries += 1
        features = self.entries.get(mm_hash)
        if features is not None:
            self.hits += 1
            self.entries.move_to_end(mm_hash)
        return features

    def _put(self, mm_hash: str, features: torch.Tensor) -> None:
        size = _nbytes(features)
        if size > self.capacity_bytes:
            return
        self.entries[mm_hash] = features
        self.num_bytes += size
        while self.num_bytes > self.capacity_bytes:
            _, evicted = self.entries.popitem(last=False)
            self.num_bytes -= _nbytes(evicted)

    def get_or_compute(self, mm_hash: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        features = self._lookup(mm_hash)
        if features is None:
            features = compute()
            self._put(mm_hash, features)
        return features
