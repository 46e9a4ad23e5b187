"""Where a long window is cut in two (`voxtral/whisper/pieces.py`): its quietest moment, at least
a piece's length from either end, however long the window is."""

import pytest
import torch

from voxtral.whisper.pieces import quietest

pytestmark = pytest.mark.untimed
PIECE = 300  # positions: the served policy's `min_piece_seconds`


@pytest.mark.parametrize("length", [2 * PIECE, 2 * PIECE + 1, 3 * PIECE])
def test_a_window_is_cut_at_its_quietest_moment_a_piece_from_either_end(length):
    """Even the last such moment, and in a window just two pieces long (the only cut there is)."""
    for quiet in (PIECE, length - PIECE):
        raw = torch.ones(80, length)
        raw[:, quiet - 5 : quiet + 5] = -1.0
        assert quietest(raw, PIECE) == quiet
