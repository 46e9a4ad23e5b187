"""Whisper's logits rules, one by one, on a toy vocabulary: 0-7 text, 8 end of text, 9
another special token, 10-19 timestamps."""

import torch

from voxtral.whisper.logits import Suppress, SuppressAtStart, TimestampRules

EOT, TB, VOCAB = 8, 10, 20
TEXT = 5.0  # text scores: far likelier than the timestamps together, unless a test says otherwise


def allowed(rule, held: list[list[int]], scores: torch.Tensor | None = None) -> list[list[int]]:
    """The tokens each row may still choose after `rule`."""
    if scores is None:
        scores = torch.zeros(len(held), VOCAB)
        scores[:, :TB] = TEXT
    rule(scores, held)
    return [torch.isfinite(row).nonzero().flatten().tolist() for row in scores]


def test_a_row_starts_with_a_timestamp_no_later_than_the_initial_limit():
    rules = TimestampRules(TB, EOT, max_initial=3)
    assert allowed(rules, [[]]) == [[10, 11, 12, 13]]


def test_timestamps_pair_up_and_never_go_back():
    rules = TimestampRules(TB, EOT, max_initial=3)
    text_after_opening = [TB + 5, 2]
    closing_just_said = [TB + 5, 2, TB + 9]
    pair_just_closed = [TB + 5, 2, TB + 9, TB + 9]
    rows = allowed(rules, [text_after_opening, closing_just_said, pair_just_closed])
    assert rows[0] == [*range(TB), *range(TB + 6, VOCAB)]  # text, or a later timestamp
    assert rows[1] == [EOT, 9, *range(TB + 9, VOCAB)]  # no text: the end, or a timestamp from it on
    assert rows[2] == list(range(TB))  # text (or the end) after a closed pair


def test_a_timestamp_comes_next_where_they_together_outweigh_every_text_token():
    rules = TimestampRules(TB, EOT, max_initial=3)
    scores = torch.zeros(1, VOCAB)
    scores[0, 3] = 1.0  # the likeliest single token, yet ten timestamps together are likelier
    assert allowed(rules, [[TB + 1, 2]], scores=scores) == [list(range(TB + 2, VOCAB))]


def test_begin_suppression_applies_only_to_a_row_choosing_its_first_token():
    blank = torch.zeros(VOCAB, dtype=torch.bool)
    blank[[0, EOT]] = True
    rule = SuppressAtStart(blank)
    everything = list(range(VOCAB))
    without = [t for t in everything if t not in (0, EOT)]
    assert allowed(rule, [[], [TB, 3]]) == [without, everything]


def test_suppressed_tokens_are_never_chosen():
    tokens = torch.zeros(VOCAB, dtype=torch.bool)
    tokens[[4, 9]] = True
    assert allowed(Suppress(tokens), [[], [TB, 3]]) == [[t for t in range(VOCAB) if t not in (4, 9)]] * 2
