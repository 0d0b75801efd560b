"""Shared-prefix (cascade) decode attention: a prefix that many decoding sequences share is read once.

When 64 chats share a 2,048-token system prompt, a decode step reads those blocks 64 times: at the
llama-3.1-8b shape that is 17 GB a step, more than the weights. Instead the step attends in two
passes whose results merge exactly (each pass returns its softmax's log-sum-exp):
- every decoding row's query against the shared blocks, once, as one request of many query rows
  (a prefill kernel, which reads the blocks once per tile of queries, not once per row);
- each row against its own remaining blocks (the decode kernel).
Blocks are shared physically (the radix cache hands the same block ids to every request that
reuses a prefix), so finding the prefix is comparing block ids. Rows outside the sharing group keep
their plain result: the merge skips them.
"""

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from gpu.batch import HostBatch

# The shared pass costs two small kernels a layer; it pays once it spares at least this many KV
# token reads a layer (16 MB of bf16 KV at 8 KV heads of 128: about 6 us of HBM time on an H100,
# against the 3-5 us its launches and merge take).
MIN_SPARED_TOKEN_READS = 4096


@dataclass(frozen=True)
class SharedPrefix:
    """The plan of one shared-prefix step over its first `rows` (decoding) sequences."""

    pages: np.ndarray  # [P] int32: the block ids every sharing row starts with
    suffix_indptr: np.ndarray  # [rows+1] int32: what each row reads besides; all its pages if it does not share
    suffix_indices: np.ndarray  # [Q] int32
    shares: np.ndarray  # [rows] int32, 1 where the row reads `pages` and its result merges with the shared pass


def find_shared_prefix(host: HostBatch, rows: int, min_spared: int = MIN_SPARED_TOKEN_READS) -> SharedPrefix | None:
    """The longest run of leading blocks that the largest group of the first `rows` sequences (all
    decoding) share by id, each keeping at least its last, partly filled block to itself; None when
    that would spare fewer than `min_spared` token reads a layer. The group is the rows whose first
    block is the most common one."""
    indptr = host.kv_indptr[: rows + 1].astype(np.int64)
    pages = np.diff(indptr)  # [rows]
    can_share = pages >= 2  # a row of one block has nothing before its last block (padding rows too)
    if can_share.sum() < 2:
        return None
    firsts = host.kv_indices[indptr[:-1][can_share]]
    values, counts = np.unique(firsts, return_counts=True)
    if counts.max() < 2:
        return None
    members = np.flatnonzero(can_share)[firsts == values[counts.argmax()]]  # [M]
    limit = int(pages[members].min()) - 1
    table = host.kv_indices[indptr[members][:, None] + np.arange(limit)]  # [M, limit] their leading blocks
    differs = (table != table[0]).any(axis=0)
    shared = int(differs.argmax()) if differs.any() else limit
    if shared * host.block_size * (len(members) - 1) < min_spared:
        return None
    dropped = np.zeros(rows, np.int64)
    dropped[members] = shared
    kept_per_row = pages - dropped
    suffix_indptr = np.zeros(rows + 1, np.int64)
    np.cumsum(kept_per_row, out=suffix_indptr[1:])
    position_in_row = np.arange(indptr[-1]) - np.repeat(indptr[:-1], pages)
    keep = position_in_row >= np.repeat(dropped, pages)
    shares = np.zeros(rows, np.int32)
    shares[members] = 1
    return SharedPrefix(
        pages=table[0, :shared].astype(np.int32),
        suffix_indptr=suffix_indptr.astype(np.int32),
        suffix_indices=host.kv_indices[: indptr[-1]][keep].astype(np.int32),
        shares=shares,
    )


@triton.jit
def _merge_kernel(out_ptr, lse_ptr, other_ptr, other_lse_ptr, shares_ptr, out_strides, other_strides, num_heads,
                  head_dim, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dims = tl.arange(0, BLOCK)
    merge = dims < tl.where(tl.load(shares_ptr + row) != 0, head_dim, 0)  # a row that does not share: no lane
    lse, other_lse = tl.load(lse_ptr + row * num_heads + head), tl.load(other_lse_ptr + row * num_heads + head)
    top = tl.maximum(lse, other_lse)
    weight, other_weight = tl.exp2(lse - top), tl.exp2(other_lse - top)  # FlashInfer's log-sum-exp is base 2
    out_at = out_ptr + row * out_strides[0] + head * out_strides[1] + dims
    out = tl.load(out_at, mask=merge, other=0.0).to(tl.float32)
    other = tl.load(other_ptr + row * other_strides[0] + head * other_strides[1] + dims, mask=merge, other=0.0)
    merged = (out * weight + other.to(tl.float32) * other_weight) / (weight + other_weight)
    tl.store(out_at, merged.to(out_ptr.dtype.element_ty), mask=merge)


def merge_attention_states(out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor,
                           shares: torch.Tensor) -> None:
    """`out` becomes the attention over both passes' keys, in place, in the rows where `shares` is
    nonzero. out, other: [T, heads, head_dim], unit stride along head_dim; lse, other_lse: [T, heads]
    float32 contiguous, base 2; shares: [T] int32."""
    rows, heads, head_dim = out.shape
    if rows:
        _merge_kernel[(rows, heads)](out, lse, other, other_lse, shares, out.stride()[:2], other.stride()[:2], heads,
                                     head_dim, BLOCK=triton.next_power_of_2(head_dim))
