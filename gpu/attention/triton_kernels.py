"""Paged attention in Triton, the compute of the `triton` backend (triton_backend.py).

One kernel serves decode and prefill/extend, a program per tile of one sequence's new tokens and
one KV head (paged_tiles.py: the tiles and their online softmax). Decode can also split a
sequence's keys over several programs (flash-decoding) whose partial results a second kernel
merges. TRITON_INTERPRET=1 runs these on the CPU for tests.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from gpu.attention.base import Paged
from gpu.attention.paged_tiles import attend_key_range, load_query_tile
from gpu.attention.triton_launch import ExtendTiles, TileConfig, block_d, query_tiles, tile_arguments


def _config(group: int, head_dim: int, dtype: torch.dtype, decode: bool) -> TileConfig:
    # Chosen at bf16, head_dim 128: decode in 64-key steps reads K/V near the device's copy rate, and
    # extend is quicker on 128 x 128 tiles, which fit in shared memory for 16-bit types.
    rows = triton.next_power_of_2(group)
    wide = head_dim > 128
    if decode:  # one token, so a tile's rows are the group, padded to the dot's minimum of 16
        return TileConfig(max(16, rows), 32 if wide else 64, 8 if wide else 4, 2)
    if dtype.itemsize == 2 and not wide:
        return TileConfig(max(128, rows), 128, 8, 2)
    return TileConfig(max(64, rows), 32 if wide else 64, 8 if wide else 4, 2)


@triton.jit
def _split_len(context_len, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    # Keys per split, in whole key tiles: a short context fills only its first splits.
    return tl.cdiv(tl.cdiv(context_len, NUM_SPLITS), BLOCK_N) * BLOCK_N


@triton.jit
def _attention_kernel(
    q_ptr,
    out_ptr,
    lse_ptr,
    cache_ptr,
    query_start_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    last_page_len_ptr,
    tile_seq_ptr,
    tile_index_ptr,
    qk_scale,
    block_size,
    q_token_stride,
    q_head_stride,
    page_stride,
    kv_stride,
    slot_stride,
    kv_head_stride,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DECODE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # Grid: (tiles, kv_heads, splits). A decode batch has one token per sequence: tile = sequence.
    q, q_pos, row_valid, out_rows, dims, dim_valid, first_pos, key_end, page_first, context_len, kv_head_offset = (
        load_query_tile(
            q_ptr, query_start_ptr, kv_indptr_ptr, last_page_len_ptr, tile_seq_ptr, tile_index_ptr, block_size,
            q_token_stride, q_head_stride, kv_head_stride, GROUP, HEAD_DIM, BLOCK_D, BLOCK_M, DECODE,
        )
    )  # fmt: skip
    split = tl.program_id(2)
    split_len = _split_len(context_len, NUM_SPLITS, BLOCK_N)
    key_start = split * split_len
    # This program's keys: up to its last token's position, cut to its split.
    key_end = tl.minimum(key_end, key_start + split_len)
    acc, m, l = attend_key_range(
        q, q_pos, first_pos, cache_ptr, kv_indices_ptr, page_first, key_start, key_end, qk_scale, block_size,
        page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid,
        BLOCK_M, BLOCK_D, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip

    out_mask = row_valid[:, None] & dim_valid[None, :]
    if NUM_SPLITS == 1:
        out = (acc / l[:, None]).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :], out, mask=out_mask)
    elif key_start < key_end:  # a split past the context writes nothing, and the merge skips it
        # Partial results [T, heads, splits, head_dim] float32 and their log2-sum-exp2 [T, heads, splits].
        part_rows = out_rows * NUM_SPLITS + split
        tl.store(out_ptr + part_rows[:, None] * HEAD_DIM + dims[None, :], acc / l[:, None], mask=out_mask)
        tl.store(lse_ptr + part_rows, m + tl.log2(l), mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    kv_indptr_ptr,
    last_page_len_ptr,
    block_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Grid: (seqs, heads); decode, so token = sequence.
    seq = tl.program_id(0)
    row = seq.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
    context_len = (tl.load(kv_indptr_ptr + seq + 1) - tl.load(kv_indptr_ptr + seq) - 1) * block_size + tl.load(
        last_page_len_ptr + seq
    )
    splits = tl.arange(0, BLOCK_S)
    used = (splits < NUM_SPLITS) & (splits * _split_len(context_len, NUM_SPLITS, BLOCK_N) < context_len)
    lse = tl.load(lse_ptr + row * NUM_SPLITS + splits, mask=used, other=float("-inf"))  # split 0 is always used
    weight = tl.exp2(lse - tl.max(lse, 0))  # [BLOCK_S]
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    parts = tl.load(
        part_ptr + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=used[:, None] & dim_valid[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty), mask=dim_valid)


def extend_tiles(
    query_start: torch.Tensor, host_query_lens: np.ndarray, group: int, head_dim: int, dtype: torch.dtype
) -> ExtendTiles:
    """The tiles of an extend step, as many tokens each as this kernel's tiles take (query_tiles)."""
    return query_tiles(query_start, host_query_lens, _config(group, head_dim, dtype, decode=False).block_m // group)


def decode_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    paged: Paged,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new token per sequence. q: [S, heads, head_dim]; cache: [blocks, 2, block_size, kv_heads,
    head_dim] -> `out` (new if None) [S, heads, head_dim]"""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    seqs, heads, head_dim = q.shape
    if not seqs:
        return out
    config = _config(heads // cache.shape[3], head_dim, q.dtype, decode=True)
    if num_splits == 1:
        _launch(q, cache, paged, out, out, None, None, seqs, 1, config, scale)
        return out
    part = torch.empty(seqs, heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(seqs, heads, num_splits, dtype=torch.float32, device=q.device)
    _launch(q, cache, paged, part, lse, None, None, seqs, num_splits, config, scale)
    _merge_splits_kernel[(seqs, heads)](
        part,
        lse,
        out,
        paged.kv_indptr,
        paged.last_page_len,
        cache.shape[2],
        HEAD_DIM=head_dim,
        BLOCK_D=block_d(head_dim),
        NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_N=config.block_n,
        num_warps=4 if head_dim >= 128 else 2,
    )
    return out


def extend_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    paged: Paged,
    query_start: torch.Tensor,
    tiles: ExtendTiles,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Any number of new tokens per sequence, causal over its cached prefix and themselves.
    q: [T, heads, head_dim]; query_start [S+1]; the rest as for decode_attention -> `out` [T, heads, head_dim]"""
    group = q.shape[1] // cache.shape[3]
    config = _config(group, q.shape[2], q.dtype, decode=False)
    if tiles.tokens != config.block_m // group:
        raise ValueError(
            f"the tiles were planned for {tiles.tokens} tokens each, but {q.dtype} queries of "
            f"{q.shape[1]} heads over {cache.shape[3]} KV heads take {config.block_m // group}"
        )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    num_tiles = len(tiles.seq)
    if num_tiles:
        _launch(q, cache, paged, out, out, tiles, query_start, num_tiles, 1, config, scale)
    return out


def _launch(q, cache, paged: Paged, out, lse, tiles, query_start, num_tiles: int, num_splits: int, config, scale):
    _attention_kernel[(num_tiles, cache.shape[3], num_splits)](
        out_ptr=out,
        lse_ptr=lse,
        NUM_SPLITS=num_splits,
        **tile_arguments(q, cache, paged, tiles, query_start, scale, config),
    )
