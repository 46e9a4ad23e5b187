"""Encoder outputs by content hash, reference counted, with a per-request index."""

from collections import OrderedDict


class EncoderCacheManager:
    """Tracks which encoder outputs are resident, in embedding rows out of `capacity_rows`.

    An entry is referenced by `(request_id, input_id)` pairs, so one request that holds
    the same hash twice keeps it until both are freed. Unreferenced entries stay resident
    and are evicted least-recently-freed first, only when room is needed, unless
    `keep_unreferenced` is off: a family whose outputs depend on the utterance's history
    can never reuse them, so they go as soon as the last reference does.

    It knows requests and inputs by plain ids only: the scheduler owns the requests.
    """

    def __init__(self, capacity_rows: int, keep_unreferenced: bool = True) -> None:
        self.capacity_rows = capacity_rows
        self.keep_unreferenced = keep_unreferenced
        self.num_free_rows = capacity_rows
        self.num_freeable_rows = capacity_rows
        self.num_rows: dict[str, int] = {}
        self.refs: dict[str, set[tuple[str, int]]] = {}
        self.freeable: OrderedDict[str, int] = OrderedDict()
        # request_id -> {input_id: mm_hash}: what a request references, found in O(1)
        self.input_ids_by_request: dict[str, dict[int, str]] = {}
        self.freed: list[str] = []

    @property
    def num_used_rows(self) -> int:
        return self.capacity_rows - self.num_free_rows

    @property
    def num_referenced_rows(self) -> int:
        return self.capacity_rows - self.num_freeable_rows

    def _ref(self, request_id: str, input_id: int, mm_hash: str) -> None:
        self.refs[mm_hash].add((request_id, input_id))
        self.input_ids_by_request.setdefault(request_id, {})[input_id] = mm_hash

    def _unindex(self, request_id: str, input_id: int) -> str | None:
        ids = self.input_ids_by_request.get(request_id)
        if ids is None:
            return None
        mm_hash = ids.pop(input_id, None)
        if not ids:
            del self.input_ids_by_request[request_id]
        return mm_hash

    def check_and_update_cache(self, request_id: str, input_id: int, mm_hash: str) -> bool:
        """True if the input's output is resident (or allocated this step); takes a reference."""
        if mm_hash not in self.refs:
            return False
        if not self.refs[mm_hash]:
            self.num_freeable_rows -= self.freeable.pop(mm_hash)
        self._ref(request_id, input_id, mm_hash)
        return True

    def can_allocate(self, num_rows: int, encoder_budget: int) -> bool:
        """Whether `num_rows` fit the step's encoder budget and the cache, evicting if needed."""
        if num_rows > encoder_budget:
            return False
        if num_rows <= self.num_free_rows:
            return True
        if num_rows > self.num_freeable_rows:
            return False
        while self.num_free_rows < num_rows:
            mm_hash, rows = self.freeable.popitem(last=False)
            del self.refs[mm_hash]
            del self.num_rows[mm_hash]
            self.freed.append(mm_hash)
            self.num_free_rows += rows
        return True

    def allocate(self, request_id: str, input_id: int, mm_hash: str, num_rows: int) -> None:
        self.refs[mm_hash] = set()
        self.num_rows[mm_hash] = num_rows
        self._ref(request_id, input_id, mm_hash)
        self.num_free_rows -= num_rows
        self.num_freeable_rows -= num_rows

    def get_cached_input_ids(self, request_id: str) -> set[int]:
        return set(self.input_ids_by_request.get(request_id, ()))

    def free_encoder_input(self, request_id: str, input_id: int) -> None:
        # The index goes first: the entry itself may already be gone (evicted or discarded).
        mm_hash = self._unindex(request_id, input_id)
        refs = self.refs.get(mm_hash) if mm_hash is not None else None
        if refs is None:
            return
        refs.discard((request_id, input_id))
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

    def free(self, request_id: str) -> None:
        """Drop every reference the request holds; its entries become evictable."""
        for input_id in self.get_cached_input_ids(request_id):
            self.free_encoder_input(request_id, input_id)

    def discard(self, mm_hash: str) -> None:
        """Forget an entry whose encoder output was never produced (its step failed)."""
        refs = self.refs.pop(mm_hash, None)
        if refs is None:
            return
        for request_id, input_id in refs:
            self._unindex(request_id, input_id)
        rows = self.num_rows.pop(mm_hash)
        if self.freeable.pop(mm_hash, None) is None:
            self.num_freeable_rows += rows  # it was referenced: not yet counted as freeable
        self.num_free_rows += rows
        self.freed.append(mm_hash)

    def get_freed_mm_hashes(self) -> list[str]:
        """Hashes evicted since the last call, so the runner can drop their tensors."""
        freed, self.freed = self.freed, []
        return freed
