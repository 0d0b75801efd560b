"""Shared-prefix decode: finding the blocks many rows share, and merging the two passes' results.

The planner is numpy; the merge kernel runs on a CUDA GPU or under Triton's interpreter on the CPU.
"""

import numpy as np
import pytest
import torch

from gpu.attention.shared_prefix import find_shared_prefixes, merge_attention_states
from gpu.batch import HostBatch
from tests.devices import DEVICE, needs_triton

BLOCK = 4


def decode_batch(tables: list[list[int]], context_lens: list[int]) -> HostBatch:
    return HostBatch.build([[1]] * len(tables), [n - 1 for n in context_lens], tables, BLOCK)


def rows_of(host: HostBatch) -> list[list[int]]:
    return [host.kv_indices[a:b].tolist() for a, b in zip(host.kv_indptr[:-1], host.kv_indptr[1:])]


def groups_of(shared) -> list[tuple[list[int], list[int]]]:
    """(rows, shared blocks) of each group of a plan."""
    q, pg = shared.query_indptr, shared.pages_indptr
    return [
        (shared.order[q[g] : q[g + 1]].tolist(), shared.pages[pg[g] : pg[g + 1]].tolist())
        for g in range(shared.num_groups)
    ]


def suffixes_of(shared) -> list[list[int]]:
    ip = shared.suffix_indptr
    return [shared.suffix_indices[a:b].tolist() for a, b in zip(ip[:-1], ip[1:])]


def test_a_group_shares_its_common_blocks_and_each_member_keeps_its_last_block():
    tables = [
        [0, 1, 2, 10],  # the group of block 0: 0, 1, 2 in common
        [7, 8],  # another first block, alone: no group
        [0, 1, 2, 11, 12],
        [0, 1, 2, 13],
        [20],  # one block: its last, nothing to share
        [0, 1, 2],  # shares 0, 1; block 2 is its last, partly filled
    ]
    host = decode_batch(tables, [14, 6, 18, 15, 2, 10])
    shared = find_shared_prefixes(host, rows=len(tables), min_spared=0)
    assert groups_of(shared) == [([0, 2, 3, 5], [0, 1])]  # capped by the last row, whose block 2 is its own
    assert shared.order.tolist() == [0, 2, 3, 5, 1, 4]
    assert shared.slots.tolist() == [0, -1, 1, 2, -1, 3]
    assert suffixes_of(shared) == [[2, 10], [7, 8], [2, 11, 12], [2, 13], [20], [2]]
    for suffix, row, slot in zip(suffixes_of(shared), rows_of(host), shared.slots):
        assert ([0, 1] if slot >= 0 else []) + suffix == row  # every block read exactly once


def test_each_prompt_of_many_forks_is_a_group():
    tables = [[0, 1, 5], [9, 8, 6], [0, 1, 7], [9, 8, 3], [9, 8, 4]]
    shared = find_shared_prefixes(decode_batch(tables, [10] * 5), rows=5, min_spared=0)
    assert groups_of(shared) == [([1, 3, 4], [9, 8]), ([0, 2], [0, 1])]  # the one sparing most first
    assert shared.slots.tolist() == [3, 0, 4, 1, 2]
    assert suffixes_of(shared) == [[5], [6], [7], [3], [4]]
    only_one = find_shared_prefixes(decode_batch(tables, [10] * 5), rows=5, min_spared=0, max_groups=1)
    assert groups_of(only_one) == [([1, 3, 4], [9, 8])]
    assert only_one.slots.tolist() == [-1, 0, -1, 1, 2] and suffixes_of(only_one)[0] == [0, 1, 5]


def test_rows_that_diverge_share_up_to_the_first_difference():
    host = decode_batch([[0, 1, 5, 6, 9], [0, 1, 5, 7, 8]], [20, 20])
    assert groups_of(find_shared_prefixes(host, rows=2, min_spared=0)) == [([0, 1], [0, 1, 5])]


def test_only_the_first_rows_are_planned():
    host = decode_batch([[0, 1, 2], [0, 1, 3], [0, 1, 4]], [12, 12, 12])
    shared = find_shared_prefixes(host, rows=2, min_spared=0)
    assert len(shared.slots) == 2 and shared.suffix_indptr.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "tables, lengths",
    [
        ([[0, 1], [2, 3], [4, 5]], [5, 5, 5]),  # no block in common
        ([[0], [0], [0]], [3, 3, 3]),  # the one block each has is its last
    ],
)
def test_nothing_to_share(tables, lengths):
    assert find_shared_prefixes(decode_batch(tables, lengths), rows=len(tables), min_spared=0) is None


def test_a_prefix_too_short_to_pay_is_not_shared():
    host = decode_batch([[0, 1, 2], [0, 1, 3]], [12, 12])  # spares 2 blocks of 4 tokens once: 8 reads
    assert find_shared_prefixes(host, rows=2, min_spared=8) is not None
    assert find_shared_prefixes(host, rows=2, min_spared=9) is None


@pytest.mark.gpu
@needs_triton
def test_merging_two_halves_gives_attention_over_all_keys():
    """Attention over 12 keys equals the merge of attention over the first 5 and over the other 7,
    each with its base-2 log-sum-exp, wherever the second pass put a row; a row of slot -1 keeps its
    first result."""
    gen = torch.Generator().manual_seed(0)
    rows, heads, dim, keys = 3, 2, 64, 12
    q, k, v = (
        torch.randn(*shape, generator=gen) for shape in ((rows, heads, dim), (heads, keys, dim), (heads, keys, dim))
    )
    scores = torch.einsum("rhd,hkd->rhk", q, k) / dim**0.5

    def attend(part: slice) -> tuple[torch.Tensor, torch.Tensor]:
        s = scores[..., part]
        out = torch.einsum("rhk,hkd->rhd", s.softmax(-1), v[:, part])
        return out.to(torch.bfloat16).to(DEVICE), (torch.logsumexp(s, -1) / np.log(2)).float().to(DEVICE)

    out, lse = attend(slice(0, 5))
    first_half = out.clone()
    other, other_lse = attend(slice(5, keys))
    # The second pass's rows come in another order: row 0's result is its row 1, row 2's its row 0.
    other, other_lse = other[[2, 0]].contiguous(), other_lse[[2, 0]].contiguous()
    slots = torch.tensor([1, -1, 0], dtype=torch.int32, device=DEVICE)
    merge_attention_states(out, lse, other, other_lse, slots)
    whole, _ = attend(slice(0, keys))
    for row in (0, 2):
        assert torch.allclose(out[row].float(), whole[row].float(), atol=2e-2)
    assert torch.equal(out[1], first_half[1])
