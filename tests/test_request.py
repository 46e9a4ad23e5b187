import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import PLACEHOLDER, AudioItem, PlaceholderRange, Request


def forward_resolve(output: list[int], sampled: list[int]) -> list[int]:
    out = list(output)
    first = next(i for i, t in enumerate(out) if t == PLACEHOLDER) if sampled else 0
    out[first : first + len(sampled)] = sampled
    return out


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=30), st.randoms())
def test_resolve_equals_forward_scan(ops, rnd):
    request = Request("r")
    reference: list[int] = []
    for n_new, n_resolve in ops:
        request.append_placeholders(n_new)
        reference += [PLACEHOLDER] * n_new
        n_resolve = min(n_resolve, request.num_placeholders)
        sampled = [rnd.randrange(0, 50000) for _ in range(n_resolve)]
        request.resolve(sampled)
        reference = forward_resolve(reference, sampled)
        assert request.output_token_ids == reference
        assert request.num_placeholders == reference.count(PLACEHOLDER)


def test_resolve_more_than_pending_raises():
    request = Request("r")
    request.append_placeholders(1)
    with pytest.raises(ValueError):
        request.resolve([1, 2])


def test_add_item_extends_available_and_checks_order():
    request = Request("r")
    request.add_item(AudioItem(PlaceholderRange(0, 4), "a"))
    request.add_item(AudioItem(PlaceholderRange(4, 2), "b"))
    assert request.num_available == 6 and request.num_pending == 6
    with pytest.raises(ValueError):
        request.add_item(AudioItem(PlaceholderRange(5, 2), "c"))


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=80),
    releases=st.lists(st.integers(0, 400), min_size=1, max_size=20),
)
def test_compaction_keeps_absolute_ids_and_window_lookup_equal_to_a_linear_scan(lengths, releases):
    request, every = Request("s"), []
    for length in lengths:
        item = AudioItem(PlaceholderRange(request.num_available, length), f"h{len(every)}")
        request.add_item(item)
        every.append(item)
    for release in sorted(releases):
        request.num_computed = min(release, request.num_available)
        request.compact()
        kept = [i for i, item in enumerate(every) if item.end > request.release_position]
        # Only released items go, and then only once they are half the list: O(1) amortized.
        assert request.num_items_dropped <= (kept[0] if kept else len(every))
        assert len(request.items) <= 2 * len(kept) + 1
        assert request.num_items == len(every)
        for input_id in range(request.num_items_dropped, len(every)):
            assert request.item(input_id) is every[input_id]
        start = request.release_position
        for end in (start + 1, start + 7, request.num_available + 3):
            linear = [i for i, it in enumerate(every) if it.offset < end and it.end > start]
            assert list(request.input_ids_in_window(start, end)) == linear
