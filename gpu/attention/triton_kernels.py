"""Paged attention in Triton, the compute of the `triton` backend (triton_backend.py).

One kernel serves decode and prefill/extend. A program takes a tile of one sequence's new tokens for
one KV head; the tile's rows are (token, query head of the KV head's group) pairs, so each K/V page
is read once for the whole GQA group and even a single decode token makes a tensor-core dot.
Keys are gathered through each sequence's block table (kv_indptr + kv_indices) into an online
softmax in base 2; only the key tiles at the causal edge pay for a mask. Decode can also split a
sequence's keys over several programs (flash-decoding) whose partial results a second kernel
merges. TRITON_INTERPRET=1 runs these on the CPU for tests.
"""

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

LOG2_E = 1.4426950408889634  # scores are kept in base 2: exp2 is the GPU's native exponential


class ExtendTiles(NamedTuple):
    """The query tiles of an extend step, one program each (per KV head)."""

    seq: torch.Tensor  # [tiles] int32, the sequence a tile belongs to
    index: torch.Tensor  # [tiles] int32, its place among that sequence's tiles
    tokens: int  # new tokens per tile, fixed by the tile shape


class _Config(NamedTuple):
    block_m: int  # rows of a tile: tokens x heads of the group
    block_n: int  # keys per loop step
    num_warps: int
    num_stages: int


def _config(group: int, head_dim: int, dtype: torch.dtype, decode: bool) -> _Config:
    # Chosen at bf16, head_dim 128: decode in 64-key steps reads K/V near the device's copy rate, and
    # extend is quicker on 128 x 128 tiles, which fit in shared memory for 16-bit types.
    rows = triton.next_power_of_2(group)
    wide = head_dim > 128
    if decode:  # one token, so a tile's rows are the group, padded to the dot's minimum of 16
        return _Config(max(16, rows), 32 if wide else 64, 8 if wide else 4, 2)
    if dtype.itemsize == 2 and not wide:
        return _Config(max(128, rows), 128, 8, 2)
    return _Config(max(64, rows), 32 if wide else 64, 8 if wide else 4, 2)


@triton.jit
def _split_len(context_len, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    # Keys per split, in whole key tiles: a short context fills only its first splits.
    return tl.cdiv(tl.cdiv(context_len, NUM_SPLITS), BLOCK_N) * BLOCK_N


@triton.jit
def attend_keys(
    acc,
    m,
    l,
    q,
    q_pos,
    cache_ptr,
    kv_indices_ptr,
    page_first,
    key_start,
    key_end,
    qk_scale,
    block_size,
    page_stride,
    kv_stride,
    slot_stride,
    kv_head_offset,
    dims,
    dim_valid,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
    ROW_SUMS_BY_DOT: tl.constexpr = False,
):
    # Online softmax over keys key_start ..< key_end: acc [BLOCK_M, BLOCK_D], m and l [BLOCK_M].
    # ROW_SUMS_BY_DOT: each row's sum of p is a product with a ones matrix, summed in the order of
    # the tensor-core instruction, as P @ V is; tl.sum's order follows the tile's spread over warps.
    # (The maximum of a row is exact in any order.) A row's result is then the same bits whatever
    # the tile's rows and warps.
    for start in range(key_start, key_end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_valid = keys < key_end
        page = tl.load(kv_indices_ptr + page_first + keys // block_size, mask=key_valid, other=0).to(tl.int64)
        slot = page * page_stride + (keys % block_size) * slot_stride + kv_head_offset  # [BLOCK_N]
        kv_mask = key_valid[:, None] & dim_valid[None, :]
        k = tl.load(cache_ptr + slot[:, None] + dims[None, :], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(cache_ptr + kv_stride + slot[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if MASKED:
            scores = tl.where((keys[None, :] <= q_pos[:, None]) & key_valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        if ROW_SUMS_BY_DOT:
            ones = tl.full([BLOCK_N, 16], 1.0, v.dtype)
            l = l * alpha + tl.max(tl.dot(p.to(v.dtype), ones, input_precision=DOT_PRECISION), 1)
        else:
            l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new
    return acc, m, l


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
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP
    if DECODE:
        seq = tl.program_id(0)
        tile = 0
        q_start = seq
        q_len = 1
    else:
        seq = tl.load(tile_seq_ptr + tl.program_id(0))
        tile = tl.load(tile_index_ptr + tl.program_id(0))
        q_start = tl.load(query_start_ptr + seq)
        q_len = tl.load(query_start_ptr + seq + 1) - q_start
    page_first = tl.load(kv_indptr_ptr + seq)
    context_len = (tl.load(kv_indptr_ptr + seq + 1) - page_first - 1) * block_size + tl.load(last_page_len_ptr + seq)

    TOKENS: tl.constexpr = BLOCK_M // GROUP
    rows = tl.arange(0, BLOCK_M)
    token = tile * TOKENS + rows // GROUP  # among the sequence's new tokens
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < TOKENS * GROUP) & (token < q_len)
    # A new token sits at context_len - q_len + token and sees the keys up to it. Padding rows get
    # positions past the context, so no row ever sees only masked keys (no -inf - -inf below).
    q_pos = context_len - q_len + token
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q_offsets = (q_start + token).to(tl.int64)[:, None] * q_token_stride + head[:, None] * q_head_stride + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]

    first_pos = context_len - q_len + tile * TOKENS  # the tile's first token's position
    split_len = _split_len(context_len, NUM_SPLITS, BLOCK_N)
    key_start = split * split_len
    # This program's keys: up to its last token's position, cut to its split.
    key_end = tl.minimum(tl.minimum(context_len, first_pos + TOKENS), key_start + split_len)
    # Every row sees the keys up to first_pos: those whole key tiles need no causal mask.
    seen_by_all = tl.maximum(tl.minimum(key_end, first_pos + 1) - key_start, 0)
    unmasked_end = key_start + seen_by_all // BLOCK_N * BLOCK_N
    kv_head_offset = kv_head * kv_head_stride
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max score of each row
    l = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, m, l = attend_keys(
        acc,
        m,
        l,
        q,
        q_pos,
        cache_ptr,
        kv_indices_ptr,
        page_first,
        key_start,
        unmasked_end,
        qk_scale,
        block_size,
        page_stride,
        kv_stride,
        slot_stride,
        kv_head_offset,
        dims,
        dim_valid,
        BLOCK_N,
        DOT_PRECISION,
        False,
    )
    acc, m, l = attend_keys(
        acc,
        m,
        l,
        q,
        q_pos,
        cache_ptr,
        kv_indices_ptr,
        page_first,
        unmasked_end,
        key_end,
        qk_scale,
        block_size,
        page_stride,
        kv_stride,
        slot_stride,
        kv_head_offset,
        dims,
        dim_valid,
        BLOCK_N,
        DOT_PRECISION,
        True,
    )

    out_rows = (q_start + token).to(tl.int64) * num_heads + head  # [T, heads] row of each tile row
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
    """The tiles of an extend step, computed on query_start's device; the host copy of the query
    lengths only sizes them, so nothing waits on the device."""
    return query_tiles(query_start, host_query_lens, _config(group, head_dim, dtype, decode=False).block_m // group)


def query_tiles(query_start: torch.Tensor, host_query_lens: np.ndarray, tokens: int) -> ExtendTiles:
    """Each sequence's new tokens cut into tiles of `tokens`, as extend_tiles does for any tile size."""
    total = int((-(-host_query_lens // tokens)).sum())
    tiles = (query_start[1:] - query_start[:-1] + tokens - 1) // tokens  # [S]
    seqs = torch.arange(len(tiles), dtype=torch.int32, device=query_start.device)
    seq = torch.repeat_interleave(seqs, tiles, output_size=total)  # [tiles]
    first_tile = torch.cumsum(tiles, 0, dtype=torch.int32) - tiles  # [S]
    index = torch.arange(total, dtype=torch.int32, device=query_start.device) - first_tile[seq]
    return ExtendTiles(seq, index, tokens)


def decode_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    last_page_len: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new token per sequence. q: [S, heads, head_dim]; cache: [blocks, 2, block_size, kv_heads,
    head_dim]; kv_indptr [S+1], kv_indices [P], last_page_len [S] int32 -> `out` (new if None) [S, heads, head_dim]"""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    seqs, heads, head_dim = q.shape
    if not seqs:
        return out
    config = _config(heads // cache.shape[3], head_dim, q.dtype, decode=True)
    no_query_start = kv_indptr  # decode has one token per sequence and reads no query_start
    if num_splits == 1:
        _launch(q, out, out, cache, no_query_start, kv_indptr, kv_indices, last_page_len, None, seqs, 1, config, scale)
        return out
    part = torch.empty(seqs, heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(seqs, heads, num_splits, dtype=torch.float32, device=q.device)
    _launch(
        q, part, lse, cache, no_query_start, kv_indptr, kv_indices, last_page_len, None, seqs, num_splits, config, scale
    )
    _merge_splits_kernel[(seqs, heads)](
        part,
        lse,
        out,
        kv_indptr,
        last_page_len,
        cache.shape[2],
        HEAD_DIM=head_dim,
        BLOCK_D=_block_d(head_dim),
        NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_N=config.block_n,
        num_warps=4 if head_dim >= 128 else 2,
    )
    return out


def extend_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    query_start: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    last_page_len: torch.Tensor,
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
        _launch(
            q, out, out, cache, query_start, kv_indptr, kv_indices, last_page_len, tiles, num_tiles, 1, config, scale
        )
    return out


def _launch(
    q,
    out,
    lse,
    cache,
    query_start,
    kv_indptr,
    kv_indices,
    last_page_len,
    tiles: ExtendTiles | None,
    num_tiles: int,
    num_splits: int,
    config: _Config,
    scale: float,
) -> None:
    if q.stride(-1) != 1:
        q = q.contiguous()
    head_dim, kv_heads = q.shape[2], cache.shape[3]
    decode = tiles is None  # decode reads no tiles: any int32 pointer stands in
    _attention_kernel[(num_tiles, kv_heads, num_splits)](
        q,
        out,
        lse,
        cache,
        query_start,
        kv_indptr,
        kv_indices,
        last_page_len,
        kv_indptr if decode else tiles.seq,
        kv_indptr if decode else tiles.index,
        scale * LOG2_E,
        cache.shape[2],
        q.stride(0),
        q.stride(1),
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        cache.stride(3),
        GROUP=q.shape[1] // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=_block_d(head_dim),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        NUM_SPLITS=num_splits,
        DECODE=decode,
        # float32 must stay float32: TF32 would cost it the precision it was chosen for.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))  # the dot's minimum K
