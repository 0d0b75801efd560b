"""Shared-prefix decode: finding the blocks many rows share, and merging the two passes' results.

The planner is numpy; the merge kernel runs on a CUDA GPU or under Triton's interpreter on the CPU.
"""

import os

import numpy as np
import pytest
import torch

from gpu.attention.shared_prefix import find_shared_prefix, merge_attention_states
from gpu.batch import HostBatch

BLOCK = 4


def decode_batch(tables: list[list[int]], context_lens: list[int]) -> HostBatch:
    return HostBatch.build([[1]] * len(tables), [n - 1 for n in context_lens], tables, BLOCK)


def rows_of(host: HostBatch) -> list[list[int]]:
    return [host.kv_indices[a:b].tolist() for a, b in zip(host.kv_indptr[:-1], host.kv_indptr[1:])]


def test_the_largest_group_shares_its_common_blocks_and_keeps_its_last_block():
    tables = [
        [0, 1, 2, 10],      # the group of block 0: 0, 1, 2 in common
        [7, 8],             # another prefix, alone
        [0, 1, 2, 11, 12],
        [0, 1, 2, 13],
        [20],               # one block: its last, nothing to share
        [0, 1, 2],          # shares 0, 1; block 2 is its last, partly filled
    ]
    host = decode_batch(tables, [14, 6, 18, 15, 2, 10])
    shared = find_shared_prefix(host, rows=len(tables), min_spared=0)
    assert shared.pages.tolist() == [0, 1]  # capped by the last row, whose block 2 is its own last
    assert shared.shares.tolist() == [1, 0, 1, 1, 0, 1]
    suffixes = [shared.suffix_indices[a:b].tolist() for a, b in zip(shared.suffix_indptr[:-1], shared.suffix_indptr[1:])]
    assert suffixes == [[2, 10], [7, 8], [2, 11, 12], [2, 13], [20], [2]]
    for suffix, row, shares in zip(suffixes, rows_of(host), shared.shares):
        assert (shared.pages.tolist() if shares else []) + suffix == row  # every block read exactly once


def test_rows_that_diverge_share_up_to_the_first_difference():
    host = decode_batch([[0, 1, 5, 6, 9], [0, 1, 5, 7, 8]], [20, 20])
    assert find_shared_prefix(host, rows=2, min_spared=0).pages.tolist() == [0, 1, 5]


def test_only_the_first_rows_are_planned():
    host = decode_batch([[0, 1, 2], [0, 1, 3], [0, 1, 4]], [12, 12, 12])
    shared = find_shared_prefix(host, rows=2, min_spared=0)
    assert len(shared.shares) == 2 and shared.suffix_indptr.tolist() == [0, 1, 2]


@pytest.mark.parametrize("tables", [
    [[0, 1], [2, 3], [4, 5]],  # no block in common
    [[0], [0], [0]],           # the one block each has is its last
])
def test_nothing_to_share(tables):
    host = decode_batch(tables, [5] * len(tables) if len(tables[0]) == 2 else [3] * len(tables))
    assert find_shared_prefix(host, rows=len(tables), min_spared=0) is None


def test_a_prefix_too_short_to_pay_is_not_shared():
    host = decode_batch([[0, 1, 2], [0, 1, 3]], [12, 12])  # spares 2 blocks of 4 tokens once: 8 reads
    assert find_shared_prefix(host, rows=2, min_spared=8) is not None
    assert find_shared_prefix(host, rows=2, min_spared=9) is None


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="needs a CUDA GPU or TRITON_INTERPRET=1")
def test_merging_two_halves_gives_attention_over_all_keys():
    """Attention over 12 keys equals the merge of attention over the first 5 and over the other 7,
    each with its base-2 log-sum-exp; rows that do not share keep their first result."""
    gen = torch.Generator().manual_seed(0)
    rows, heads, dim, keys = 3, 2, 64, 12
    q, k, v = (torch.randn(*shape, generator=gen) for shape in ((rows, heads, dim), (heads, keys, dim), (heads, keys, dim)))
    scores = torch.einsum("rhd,hkd->rhk", q, k) / dim**0.5

    def attend(part: slice) -> tuple[torch.Tensor, torch.Tensor]:
        s = scores[..., part]
        out = torch.einsum("rhk,hkd->rhd", s.softmax(-1), v[:, part])
        return out.to(torch.bfloat16).to(DEVICE), (torch.logsumexp(s, -1) / np.log(2)).float().to(DEVICE)

    out, lse = attend(slice(0, 5))
    first_half = out.clone()
    other, other_lse = attend(slice(5, keys))
    shares = torch.tensor([1, 0, 1], dtype=torch.int32, device=DEVICE)
    merge_attention_states(out, lse, other, other_lse, shares)
    whole, _ = attend(slice(0, keys))
    for row in (0, 2):
        assert torch.allclose(out[row].float(), whole[row].float(), atol=2e-2)
    assert torch.equal(out[1], first_half[1])
