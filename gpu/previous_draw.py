"""The tokens the latest launch drew, kept on the device for the next launch's inputs.

A decode whose input is FROM_PREVIOUS_STEP (`SequenceInput.previous_row`) reads its token from
here, so the runner can launch step N+1 before the host has seen step N's tokens.
"""

from typing import Generic, NamedTuple

import numpy as np
import torch

from gpu.staging import Array


class TokenFeed(NamedTuple, Generic[Array]):
    """Where the tokens the previous launch drew go in this step's input ids: one row per sequence
    whose input is FROM_PREVIOUS_STEP, uploaded with the step."""

    input_index: Array  # [D] int64: the sequence's one token in the step's input ids
    drawn_index: Array  # [D] int64: its token among the previous launch's drawn tokens


class PreviousDraw:
    """The latest launch's drawn tokens on the device, and which of its sequences drew each.
    `remember` replaces them; a feed reads them in stream order, so it must be enqueued before the
    next launch's draw is remembered (the runner feeds, then draws)."""

    def __init__(self) -> None:
        self._drawn: torch.Tensor | None = None  # [R] int64 on the device
        self._row_of: np.ndarray | None = None  # [S] int64: each sequence's row in _drawn, -1 where it drew none

    def remember(self, drawn: torch.Tensor, rows: np.ndarray, num_seqs: int) -> None:
        """`drawn` [R] int64: the tokens a launch of `num_seqs` sequences drew, row i for sequence
        rows[i]."""
        self._drawn = drawn
        self._row_of = np.full(num_seqs, -1, np.int64)
        self._row_of[rows] = np.arange(len(rows))

    def feed_for(
        self, deferred: np.ndarray, previous_rows: np.ndarray, query_start: np.ndarray
    ) -> TokenFeed[np.ndarray] | None:
        """The feed of the `deferred` sequences [D], whose previous_rows [S] are >= 0, in a step laid
        out by `query_start` [S+1]; None when D is 0. Raises ValueError naming the first sequence
        that reads a token the previous launch did not draw."""
        if not len(deferred):
            return None
        if self._row_of is None:
            raise ValueError(f"sequence {deferred[0]}: feeds a token of the previous step, but none was launched")
        row_of = np.append(self._row_of, -1)  # [S' + 1]: a row past the end drew nothing either
        found = row_of[np.minimum(previous_rows[deferred], len(row_of) - 1)]  # [D]
        if (missing := np.flatnonzero(found < 0)).size:
            i = deferred[missing[0]]
            raise ValueError(f"sequence {i}: previous_row {previous_rows[i]} drew no token in the previous step")
        return TokenFeed(input_index=query_start[deferred].astype(np.int64), drawn_index=found)

    def feed(self, input_ids: torch.Tensor, feed: TokenFeed[torch.Tensor]) -> None:
        """Writes the fed tokens into `input_ids` [T] int32, on the device in stream order (no sync)."""
        drawn = self._drawn.index_select(0, feed.drawn_index)  # [D] int64
        input_ids.index_copy_(0, feed.input_index, drawn.to(torch.int32))
