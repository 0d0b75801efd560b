"""Shared-prefix (cascade) decode attention: a prefix that many decoding sequences share is read once.

When 64 chats share a 2,048-token system prompt, a decode step reads those blocks 64 times: at the
llama-3.1-8b shape that is 17 GB a step, more than the weights. Instead the step attends in two
passes whose results merge exactly (each pass returns its softmax's log-sum-exp):
- the query of every row of a group against the group's shared blocks, as one request of many
  query rows (a prefill kernel, which reads the blocks once per tile of queries and query head,
  not once per row);
- each row against its own remaining blocks (the decode kernel).
Blocks are shared physically (the radix cache hands the same block ids to every request that
reuses a prefix), so finding the groups is comparing block ids: 16 completions of each of 8 prompts
make 8 groups, 64 chats under one system prompt one. Rows in no group keep their plain result.
"""

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from gpu.batch import HostBatch, offsets

# The shared pass costs two small kernels a layer; it pays once it spares at least this many KV
# token reads a layer (16 MB of bf16 KV at 8 KV heads of 128: a few microseconds of memory reads,
# about what its extra launches and merge take).
MIN_SPARED_TOKEN_READS = 4096
# Groups the prefix pass serves at most (a CUDA graph's pass is planned for this many requests);
# beyond, the groups that spare the most reads are kept.
MAX_GROUPS = 16


@dataclass(frozen=True)
class SharedPrefixes:
    """The plan of one step whose first `rows` sequences decode and fall into groups that share
    leading blocks. The prefix pass is one request per group: its query rows are the group's
    members, its KV the group's shared blocks."""

    order: np.ndarray  # [rows] int32: the decode rows in the prefix pass's order, members group by group, then the rest
    query_indptr: np.ndarray  # [G+1] int32: group g's members are order[query_indptr[g] ..< query_indptr[g+1]]
    pages_indptr: np.ndarray  # [G+1] int32: group g's shared blocks are pages[pages_indptr[g] ..< pages_indptr[g+1]]
    pages: np.ndarray  # [P] int32
    slots: np.ndarray  # [rows] int32: each row's place in the prefix pass, -1 where it shares nothing
    suffix_indptr: np.ndarray  # [rows+1] int32: the blocks each row reads besides (all its blocks if it shares nothing)
    suffix_indices: np.ndarray  # [Q] int32

    @property
    def num_groups(self) -> int:
        return len(self.query_indptr) - 1


def find_shared_prefixes(
    host: HostBatch, rows: int, min_spared: int = MIN_SPARED_TOKEN_READS, max_groups: int = MAX_GROUPS
) -> SharedPrefixes | None:
    """Groups the first `rows` sequences (all decoding) by their first block id, and gives each group
    the run of leading blocks all its members share, each member keeping at least its last, partly
    filled block to itself. Keeps the `max_groups` groups that spare the most token reads a layer;
    None when they spare fewer than `min_spared` in all."""
    indptr = host.kv_indptr[: rows + 1].astype(np.int64)
    pages = np.diff(indptr)  # [rows]
    candidates = np.flatnonzero(pages >= 2)  # a row of one block has nothing before its last (padding rows too)
    if len(candidates) < 2:
        return None
    firsts = host.kv_indices[indptr[candidates]]
    by_first = np.argsort(firsts, kind="stable")
    candidates, firsts = candidates[by_first], firsts[by_first]  # [C], a group's rows adjacent
    group_starts = np.flatnonzero(np.r_[True, firsts[1:] != firsts[:-1]])  # [G0]
    group_sizes = np.diff(np.r_[group_starts, len(candidates)])
    if group_sizes.max() < 2:  # no two rows start alike: the common case without a prefix cache
        return None
    # Each candidate's leading blocks but its last, padded with -1, against its group's first row's.
    limits = pages[candidates] - 1  # [C]
    columns = np.arange(limits.max())
    valid = columns < limits[:, None]  # [C, L]
    table = np.where(valid, host.kv_indices[np.minimum(indptr[candidates][:, None] + columns, indptr[-1] - 1)], -1)
    leader = np.repeat(group_starts, group_sizes)  # [C] the row of the candidate's group its blocks are compared to
    same = (table == table[leader]) & valid
    common = np.where(same.all(axis=1), limits, same.argmin(axis=1))  # [C] blocks shared with the group's first
    shared = np.minimum.reduceat(common, group_starts)  # [G0] blocks every member shares
    spared = shared * host.block_size * (group_sizes - 1)
    kept = [g for g in np.argsort(-spared, kind="stable")[:max_groups] if spared[g] > 0]
    if sum(spared[g] for g in kept) < min_spared or not kept:
        return None
    members = [candidates[group_starts[g] : group_starts[g] + group_sizes[g]] for g in kept]
    member_rows = np.concatenate(members)
    slots = np.full(rows, -1, np.int64)
    slots[member_rows] = np.arange(len(member_rows))
    dropped = np.zeros(rows, np.int64)
    dropped[member_rows] = np.repeat(shared[kept], group_sizes[kept])
    position_in_row = np.arange(indptr[-1]) - np.repeat(indptr[:-1], pages)
    keep = position_in_row >= np.repeat(dropped, pages)
    return SharedPrefixes(
        order=np.concatenate([member_rows, np.flatnonzero(slots < 0)]).astype(np.int32),
        query_indptr=offsets(group_sizes[kept]).astype(np.int32),
        pages_indptr=offsets(shared[kept]).astype(np.int32),
        pages=np.concatenate([table[group_starts[g], : shared[g]] for g in kept]).astype(np.int32),
        slots=slots.astype(np.int32),
        suffix_indptr=offsets(pages - dropped).astype(np.int32),
        suffix_indices=host.kv_indices[: indptr[-1]][keep].astype(np.int32),
    )


@triton.jit
def _merge_kernel(
    out_ptr,
    lse_ptr,
    other_ptr,
    other_lse_ptr,
    slots_ptr,
    out_strides,
    other_strides,
    num_heads,
    head_dim,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    dims = tl.arange(0, BLOCK)
    merge = dims < tl.where(slot >= 0, head_dim, 0)  # a row that shares nothing: no lane
    slot = tl.maximum(slot, 0)
    lse, other_lse = tl.load(lse_ptr + row * num_heads + head), tl.load(other_lse_ptr + slot * num_heads + head)
    top = tl.maximum(lse, other_lse)
    weight, other_weight = tl.exp2(lse - top), tl.exp2(other_lse - top)  # FlashInfer's log-sum-exp is base 2
    out_at = out_ptr + row * out_strides[0] + head * out_strides[1] + dims
    out = tl.load(out_at, mask=merge, other=0.0).to(tl.float32)
    other = tl.load(other_ptr + slot * other_strides[0] + head * other_strides[1] + dims, mask=merge, other=0.0)
    merged = (out * weight + other.to(tl.float32) * other_weight) / (weight + other_weight)
    tl.store(out_at, merged.to(out_ptr.dtype.element_ty), mask=merge)


def merge_attention_states(
    out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor, slots: torch.Tensor
) -> None:
    """Row r of `out` becomes the attention over both passes' keys, in place, merged with row
    slots[r] of `other`; rows whose slot is -1 stay as they are. out: [T, heads, head_dim],
    other: [T', heads, head_dim], unit stride along head_dim; lse: [T, heads], other_lse:
    [T', heads], float32 contiguous, base 2; slots: [T] int32."""
    rows, heads, head_dim = out.shape
    if rows:
        _merge_kernel[(rows, heads)](
            out,
            lse,
            other,
            other_lse,
            slots,
            out.stride()[:2],
            other.stride()[:2],
            heads,
            head_dim,
            BLOCK=triton.next_power_of_2(head_dim),
        )
