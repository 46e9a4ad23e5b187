"""Encoder outputs by content hash, reference counted, with a per-request index."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the scheduler owns this cache; a runtime import would be circular
    from scheduler.request import Request


class EncoderCacheManager:
    """Tracks which encoder outputs are resident, in embedding rows out of `capacity_rows`.

    An entry is referenced by `(request_id, input_id)` pairs, so one request that holds
    the same hash twice keeps it until both are freed. Unreferenced entries stay resident
    and are evicted least-recently-freed first, only when room is needed, unless
    `keep_unreferenced` is off: a family whose outputs depend on the session's history
    can never reuse them, so they go as soon as the last reference does.
    """

    def __init__(self, capacity_rows: int, keep_unreferenced: bool = True) -> None:
        self.capacity_rows = capacity_rows
        self.keep_unreferenced = keep_unreferenced
        self.num_free_rows = capacity_rows
        self.num_freeable_rows = capacity_rows
        self.num_rows: dict[str, int] = {}
        self.refs: dict[str, set[tuple[str, int]]] = {}
        self.freeable: OrderedDict[str, int] = OrderedDict()
        self.input_ids_by_request: dict[str, set[int]] = {}
        self.freed: list[str] = []

    @property
    def num_used_rows(self) -> int:
        return self.capacity_rows - self.num_free_rows

    def _ref(self, request: Request, input_id: int, mm_hash: str) -> None:
        self.refs[mm_hash].add((request.request_id, input_id))
        self.input_ids_by_request.setdefault(request.request_id, set()).add(input_id)

    def check_and_update_cache(self, request: Request, input_id: int) -> bool:
        """True if the input's output is resident (or allocated this step); takes a reference."""
        mm_hash = request.items[input_id].mm_hash
        if mm_hash not in self.refs:
            return False
        if not self.refs[mm_hash]:
            self.num_freeable_rows -= self.freeable.pop(mm_hash)
        self._ref(request, input_id, mm_hash)
        return True

    def can_allocate(
        self, request: Request, input_id: int, encoder_budget: int, num_rows_to_schedule: int
    ) -> bool:
        """Whether the input fits the step's encoder budget and the cache, evicting if needed."""
        num_rows = request.items[input_id].num_embeds
        if num_rows > encoder_budget:
            return False
        needed = num_rows + num_rows_to_schedule
        if needed <= self.num_free_rows:
            return True
        if needed > self.num_freeable_rows:
            return False
        while self.num_free_rows < needed:
            mm_hash, rows = self.freeable.popitem(last=False)
            del self.refs[mm_hash]
            del self.num_rows[mm_hash]
            self.freed.append(mm_hash)
            self.num_free_rows += rows
        return True

    def allocate(self, request: Request, input_id: int) -> None:
        item = request.items[input_id]
        rows = item.num_embeds
        self.refs[item.mm_hash] = set()
        self.num_rows[item.mm_hash] = rows
        self._ref(request, input_id, item.mm_hash)
        self.num_free_rows -= rows
        self.num_freeable_rows -= rows

    def get_cached_input_ids(self, request: Request) -> set[int]:
        return self.input_ids_by_request.get(request.request_id, set())

    def free_encoder_input(self, request: Request, input_id: int) -> None:
        # The index goes first: the entry itself may already be gone (evicted or never allocated).
        ids = self.input_ids_by_request.get(request.request_id)
        if ids is not None:
            ids.discard(input_id)
            if not ids:
                del self.input_ids_by_request[request.request_id]
        mm_hash = request.items[input_id].mm_hash
        refs = self.refs.get(mm_hash)
        if refs is None:
            return
        refs.discard((request.request_id, input_id))
        if refs or mm_hash in self.freeable:
            return
        rows = self.num_rows[mm_hash]
        self.num_freeable_rows += rows
        if self.keep_unreferenced:
            self.freeable[mm_hash] = rows
        else:
            del self.refs[mm_hash]
            del self.num_rows[mm_hash]
            self.num_free_rows += rows
            self.freed.append(mm_hash)

    def free(self, request: Request) -> None:
        """Drop every reference the request holds; its entries become evictable."""
        for input_id in list(self.get_cached_input_ids(request)):
            self.free_encoder_input(request, input_id)

    def discard(self, mm_hash: str) -> None:
        """Forget an entry whose encoder output was never produced (its step failed)."""
        refs = self.refs.pop(mm_hash, None)
        if refs is None:
            return
        for request_id, input_id in refs:
            ids = self.input_ids_by_request.get(request_id)
            if ids is not None:
                ids.discard(input_id)
                if not ids:
                    del self.input_ids_by_request[request_id]
        rows = self.num_rows.pop(mm_hash)
        if self.freeable.pop(mm_hash, None) is None:
            self.num_freeable_rows += rows  # it was referenced: not yet counted as freeable
        self.num_free_rows += rows
        self.freed.append(mm_hash)

    def get_freed_mm_hashes(self) -> list[str]:
        """Hashes evicted since the last call, so the runner can drop their tensors."""
        freed, self.freed = self.freed, []
        return freed
