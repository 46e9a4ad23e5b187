from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cache import EncoderCacheManager
from scheduler import AudioItem, PlaceholderRange, Request

HASHES = [f"h{i}" for i in range(6)]
ROWS = {h: 1 + i for i, h in enumerate(HASHES)}  # one hash always has one size


class EncoderCacheMachine(RuleBasedStateMachine):
    """Random allocate/ref/free sequences against a plain model of who references what."""

    @initialize(capacity=st.integers(6, 24), keep=st.booleans())
    def setup(self, capacity, keep):
        self.cache = EncoderCacheManager(capacity, keep_unreferenced=keep)
        self.requests: dict[str, Request] = {}
        self.model_refs: dict[str, set[tuple[str, int]]] = {}
        self.counter = 0

    @rule(hashes=st.lists(st.sampled_from(HASHES), min_size=1, max_size=5))
    def add_request(self, hashes):
        request = Request(f"r{self.counter}")
        self.counter += 1
        offset = 0
        for h in hashes:
            request.add_item(AudioItem(PlaceholderRange(offset, ROWS[h]), h))
            offset += ROWS[h]
        self.requests[request.request_id] = request

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def use_input(self, data):
        request = data.draw(st.sampled_from(sorted(self.requests.values(), key=lambda r: r.request_id)))
        input_id = data.draw(st.integers(0, len(request.items) - 1))
        mm_hash = request.items[input_id].mm_hash
        if self.cache.check_and_update_cache(request.request_id, input_id, mm_hash):
            assert mm_hash in self.cache.refs
        elif self.cache.can_allocate(ROWS[mm_hash], encoder_budget=100):
            self.cache.allocate(request.request_id, input_id, mm_hash, ROWS[mm_hash])
        else:
            return
        self.model_refs.setdefault(mm_hash, set()).add((request.request_id, input_id))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free_input(self, data):
        request = data.draw(st.sampled_from(sorted(self.requests.values(), key=lambda r: r.request_id)))
        input_id = data.draw(st.integers(0, len(request.items) - 1))
        self.cache.free_encoder_input(request.request_id, input_id)
        self.model_refs.get(request.items[input_id].mm_hash, set()).discard((request.request_id, input_id))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish_request(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.requests)))
        self.cache.free(self.requests.pop(request_id).request_id)
        for refs in self.model_refs.values():
            refs -= {ref for ref in refs if ref[0] == request_id}

    @invariant()
    def rows_add_up(self):
        resident = sum(self.cache.num_rows.values())
        assert resident == self.cache.num_used_rows <= self.cache.capacity_rows
        assert self.cache.num_free_rows >= 0
        freeable = sum(self.cache.freeable.values())
        assert self.cache.num_freeable_rows == self.cache.num_free_rows + freeable
        if not self.cache.keep_unreferenced:
            assert freeable == 0, "an unreferenced entry stayed resident"

    @invariant()
    def refs_match_model(self):
        for mm_hash, refs in self.cache.refs.items():
            assert refs == self.model_refs.get(mm_hash, set())
            assert (not refs) == (mm_hash in self.cache.freeable)
        for mm_hash, refs in self.model_refs.items():
            if refs:
                assert mm_hash in self.cache.refs, "a referenced entry was evicted"

    @invariant()
    def index_matches_refs(self):
        expected: dict[str, dict[int, str]] = {}
        for mm_hash, refs in self.cache.refs.items():
            for request_id, input_id in refs:
                expected.setdefault(request_id, {})[input_id] = mm_hash
        assert self.cache.input_ids_by_request == expected
        for request in self.requests.values():
            assert self.cache.get_cached_input_ids(request.request_id) == set(
                expected.get(request.request_id, {})
            )

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for request_id in list(self.requests):
            self.cache.free(request_id)
        assert self.cache.input_ids_by_request == {}
        assert all(not refs for refs in self.cache.refs.values())
        assert self.cache.num_freeable_rows == self.cache.capacity_rows


TestEncoderCache = EncoderCacheMachine.TestCase


def test_duplicate_hash_in_one_request_kept_until_both_freed():
    cache = EncoderCacheManager(8)
    assert not cache.check_and_update_cache("a", 0, "x")
    cache.allocate("a", 0, "x", 4)
    assert cache.check_and_update_cache("a", 1, "x")
    cache.free_encoder_input("a", 0)
    assert "x" not in cache.freeable
    cache.free_encoder_input("a", 1)
    assert "x" in cache.freeable and cache.input_ids_by_request == {}


def test_free_of_evicted_entry_still_cleans_index():
    cache = EncoderCacheManager(4)
    cache.allocate("a", 0, "x", 4)
    del cache.refs["x"], cache.num_rows["x"]  # as if evicted behind the index's back
    cache.free_encoder_input("a", 0)
    assert cache.get_cached_input_ids("a") == set()
    assert "a" not in cache.input_ids_by_request
    assert cache.get_cached_input_ids("b") == set() and "b" not in cache.input_ids_by_request


def test_eviction_is_least_recently_freed_and_reported():
    cache = EncoderCacheManager(8)
    cache.allocate("a", 0, "x", 4)
    cache.allocate("a", 1, "y", 4)
    cache.free_encoder_input("a", 1)
    cache.free_encoder_input("a", 0)
    assert cache.can_allocate(4, encoder_budget=8)
    assert cache.get_freed_mm_hashes() == ["y"]
    assert cache.get_freed_mm_hashes() == []
    assert not cache.can_allocate(4, encoder_budget=3)


def test_discard_forgets_a_referenced_or_freeable_entry():
    cache = EncoderCacheManager(8)
    cache.allocate("a", 0, "x", 4)
    cache.allocate("a", 1, "y", 4)
    cache.free_encoder_input("a", 1)
    cache.discard("x")
    cache.discard("y")
    cache.discard("never-seen")
    assert cache.refs == {} and cache.input_ids_by_request == {} and not cache.freeable
    assert cache.num_free_rows == cache.num_freeable_rows == 8
    assert cache.get_freed_mm_hashes() == ["x", "y"]
