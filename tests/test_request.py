import pytest
from hypothesis import given
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
