"""The previous launch's drawn tokens, fed into the next step's input ids on the device: the unit
under the overlap tests (tests/actors/test_overlap.py), which run it through the runner."""

import numpy as np
import pytest
import torch

from gpu.previous_draw import PreviousDraw
from gpu.staging import on_cpu


def test_a_feed_writes_each_deferred_sequence_the_token_its_previous_row_drew():
    previous = PreviousDraw()
    previous.remember(torch.tensor([70, 72]), rows=np.array([0, 2]), num_seqs=3)  # row 1 drew nothing
    # Sequence 0 feeds a prompt chunk of two tokens; 1 and 2 read rows 2 and 0 of the last launch.
    previous_rows, query_start = np.array([-1, 2, 0]), np.array([0, 2, 3, 4])
    feed = previous.feed_for(np.array([1, 2]), previous_rows, query_start)
    assert feed.input_index.tolist() == [2, 3] and feed.drawn_index.tolist() == [1, 0]
    input_ids = torch.tensor([5, 6, 0, 0], dtype=torch.int32)
    previous.feed(input_ids, on_cpu(feed))
    assert input_ids.tolist() == [5, 6, 72, 70] and input_ids.dtype == torch.int32
    assert previous.feed_for(np.zeros(0, np.int64), np.array([-1]), np.array([0, 1])) is None


@pytest.mark.parametrize("row, message", [(1, "previous_row 1 drew no token"), (5, "previous_row 5 drew no token")])
def test_a_row_that_drew_nothing_is_named(row, message):
    previous = PreviousDraw()
    with pytest.raises(ValueError, match="sequence 0: .* none was launched"):
        previous.feed_for(np.array([0]), np.array([0]), np.array([0, 1]))
    previous.remember(torch.tensor([70]), rows=np.array([0]), num_seqs=2)
    with pytest.raises(ValueError, match=f"sequence 1: {message}"):
        previous.feed_for(np.array([1]), np.array([-1, row]), np.array([0, 1, 2]))
