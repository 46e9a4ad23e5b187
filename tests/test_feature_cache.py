import torch
from hypothesis import given
from hypothesis import strategies as st

from cache import FeatureCache


def tensor(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.float32)  # 4 bytes per element


def test_lru_by_bytes_and_counters():
    cache = FeatureCache(capacity_bytes=40)
    computed = []
    for key in ["a", "b", "a", "c"]:
        cache.get_or_compute(key, lambda key=key: computed.append(key) or tensor(4))
    # a, b, c are 16 bytes each: c evicts the least recently used, b.
    assert computed == ["a", "b", "c"]
    assert (cache.queries, cache.hits) == (4, 1)
    assert "b" not in cache and "a" in cache and "c" in cache
    assert cache.num_bytes == 32


def test_entry_bigger_than_the_cache_is_not_kept():
    cache = FeatureCache(capacity_bytes=8)
    assert cache.get_or_compute("big", lambda: tensor(10)).numel() == 10
    assert len(cache) == 0 and cache.num_bytes == 0


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(1, 6)), max_size=50), st.integers(4, 60))
def test_bytes_never_exceed_capacity_and_match_entries(ops, capacity):
    cache = FeatureCache(capacity_bytes=capacity)
    sizes: dict[str, int] = {}
    for key, n in ops:
        size = sizes.setdefault(key, n)  # one key, one content
        cache.get_or_compute(key, lambda size=size: tensor(size))
        assert cache.num_bytes <= capacity
        assert cache.num_bytes == sum(t.numel() * 4 for t in cache.entries.values())
    assert cache.hits <= cache.queries == len(ops)
