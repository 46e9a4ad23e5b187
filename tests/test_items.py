import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import AudioItem, PlaceholderRange, append_item, get_items_in_window


def make_items(layout: list[tuple[int, int]]) -> list[AudioItem]:
    """Items from (gap before, length) pairs: sorted, non-overlapping, touching when gap is 0."""
    items: list[AudioItem] = []
    offset = 0
    for i, (gap, length) in enumerate(layout):
        offset += gap
        append_item(items, AudioItem(PlaceholderRange(offset, length), f"h{i}"))
        offset += length
    return items


def linear_window(items: list[AudioItem], start: int, end: int) -> list[int]:
    if start == end:
        return [i for i, it in enumerate(items) if it.offset < start < it.end]
    return [i for i, it in enumerate(items) if it.offset < end and it.end > start]


layouts = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), max_size=40)


@given(layouts, st.integers(-3, 300), st.integers(0, 40))
def test_window_lookup_equals_linear_scan(layout, start, width):
    items = make_items(layout)
    start = max(start, 0)
    lo, hi = get_items_in_window(items, start, start + width)
    assert list(range(lo, hi)) == linear_window(items, start, start + width)


def test_window_edges():
    items = make_items([(2, 3), (0, 3), (4, 2)])  # [2,5) [5,8) [12,14)
    assert get_items_in_window([], 0, 10) == (0, 0)
    assert get_items_in_window(items, 0, 2) == (0, 0)  # before the first item
    assert get_items_in_window(items, 14, 20) == (3, 3)  # after the last item
    assert get_items_in_window(items, 5, 5) == (1, 1)  # zero width on a boundary
    assert get_items_in_window(items, 6, 6) == (1, 2)  # zero width inside an item
    assert get_items_in_window(items, 4, 6) == (0, 2)  # spans the touching boundary
    assert get_items_in_window(items, 8, 12) == (2, 2)  # a gap


def test_append_rejects_overlap_and_disorder():
    items = make_items([(0, 4)])
    with pytest.raises(ValueError, match=r"offset=2.*offset=0"):
        append_item(items, AudioItem(PlaceholderRange(2, 4), "x"))
    append_item(items, AudioItem(PlaceholderRange(10, 1), "y"))
    with pytest.raises(ValueError, match=r"offset=5.*offset=10"):
        append_item(items, AudioItem(PlaceholderRange(5, 1), "z"))


def test_bad_ranges_rejected():
    with pytest.raises(ValueError):
        PlaceholderRange(0, 0)
    with pytest.raises(ValueError):
        PlaceholderRange(-1, 2)
