"""Paged attention whose every query token reduces over its keys in one order, whatever its batch,
its chunking and its cache hits: the attention of `--deterministic` (attention.py plans it).

A token's keys are cut into splits of KV_SPLIT at absolute positions (0..255, 256..511, ...). Each
split is reduced on its own, from a fresh online-softmax state, over key tiles of BLOCK_N aligned
at absolute positions too, into a normalized output and its log2-sum-exp2; the splits are then
folded in order, elementwise. Prefill tiles, chunks on a cached prefix and decodes in large
batches fold their splits in the program that made them; small decode batches, which would leave
the GPU idle, spread the splits over programs that store them, and `_fold_kernel` folds them in
the same order with the same arithmetic. A split's reduction takes the same key tiles for decode
and prefill alike (`attention_config`, from the model's shape alone), and every sum in it is a
tensor-core product (attend_key_range's row sums by dot), summed in the instruction's order
whatever the rows of the tile and the warps it is spread over: a decode's small tile gives a
prompt's bits.
Key tiles past a token's position are masked to exact zeros, and splits past it are left out of
its fold. Every launch disables floating-point fusion, so no compiler contracts a fold's multiply
and add differently in the two kernels. TRITON_INTERPRET=1 runs these on the CPU for tests.
"""

import torch
import triton
import triton.language as tl

from gpu.attention.base import Paged
from gpu.attention.paged_tiles import attend_key_range, load_query_tile
from gpu.attention.triton_launch import ExtendTiles, TileConfig, block_d, tile_arguments

KV_SPLIT = 256  # keys per split; a multiple of every BLOCK_N


def attention_config(group: int, head_dim: int, decode: bool = False) -> TileConfig:
    """A model's attention tiles: 64 rows (a prompt chunk's tokens x the group's query heads) in 4
    warps, 64 keys a step (32 past head_dim 128, in 8 warps, for the registers). A `decode` batch
    whose splits are not spread over programs holds only each token's group in a tile: 16 rows in
    2 warps (on an H200, llama-3.1-8b's decode of 256 sequences at 600 to 1,400 keys took 0.82x the
    time in them that it took in the prefill's tiles; a batch of one, spread, took 1.2x, so spread
    splits keep the prefill's). The key step is the same, which with the row sums by dot
    (paged_tiles.attend_key_range) keeps the bits."""
    wide = head_dim > 128
    if decode:
        return TileConfig(max(16, triton.next_power_of_2(group)), 32 if wide else 64, 4 if wide else 2, 2)
    return TileConfig(max(64, triton.next_power_of_2(group)), 32 if wide else 64, 8 if wide else 4, 2)


@triton.jit
def _fold(out, top, total, part, part_lse, sees):
    """The running (out [R, D], top [R], total [R]) of rows with one more split's normalized output
    `part` [R, D] and log2-sum-exp2 `part_lse` [R] folded in, where `sees` [R]. Elementwise only:
    the arithmetic is the same in any kernel and any tile shape."""
    new_top = tl.maximum(top, part_lse)
    keep = tl.exp2(top - new_top)
    take = tl.exp2(part_lse - new_top)
    new_out = out * keep[:, None] + part * take[:, None]
    new_total = total * keep + take
    return (
        tl.where(sees[:, None], new_out, out),
        tl.where(sees, new_top, top),
        tl.where(sees, new_total, total),
    )


@triton.jit
def _attention_kernel(
    q_ptr,
    out_ptr,
    part_ptr,
    lse_ptr,
    cache_ptr,
    query_start_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    last_page_len_ptr,
    tile_seq_ptr,
    tile_index_ptr,
    max_splits,
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
    KV_SPLIT: tl.constexpr,
    SPLIT_PROGRAMS: tl.constexpr,
    DECODE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # Grid: (tiles, kv_heads, SPLIT_PROGRAMS or 1). A decode batch has one token per sequence: tile = sequence.
    q, q_pos, row_valid, out_rows, dims, dim_valid, first_pos, key_end, page_first, _, kv_head_offset = (
        load_query_tile(
            q_ptr, query_start_ptr, kv_indptr_ptr, last_page_len_ptr, tile_seq_ptr, tile_index_ptr, block_size,
            q_token_stride, q_head_stride, kv_head_stride, GROUP, HEAD_DIM, BLOCK_D, BLOCK_M, DECODE,
        )
    )  # fmt: skip
    out_mask = row_valid[:, None] & dim_valid[None, :]

    if SPLIT_PROGRAMS == 0:  # every split here, folded as it is made
        out = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        top = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        for split_start in range(0, key_end, KV_SPLIT):
            split_end = tl.minimum(split_start + KV_SPLIT, key_end)
            acc, m, l = attend_key_range(
                q, q_pos, first_pos, cache_ptr, kv_indices_ptr, page_first, split_start, split_end,
                qk_scale, block_size, page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid,
                BLOCK_M, BLOCK_D, BLOCK_N, DOT_PRECISION, True,
            )  # fmt: skip
            part, part_lse = acc / l[:, None], m + tl.log2(l)  # the split's normalized output, log2-sum-exp2
            out, top, total = _fold(out, top, total, part, part_lse, split_start <= q_pos)
        tl.store(
            out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :],
            (out / total[:, None]).to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )
    else:  # splits program_id(2), + SPLIT_PROGRAMS, ...: stored for _fold_kernel [T, heads, max_splits(, head_dim)]
        for split in range(tl.program_id(2), tl.cdiv(key_end, KV_SPLIT), SPLIT_PROGRAMS):
            split_start = split * KV_SPLIT
            split_end = tl.minimum(split_start + KV_SPLIT, key_end)
            acc, m, l = attend_key_range(
                q, q_pos, first_pos, cache_ptr, kv_indices_ptr, page_first, split_start, split_end,
                qk_scale, block_size, page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid,
                BLOCK_M, BLOCK_D, BLOCK_N, DOT_PRECISION, True,
            )  # fmt: skip
            part, part_lse = acc / l[:, None], m + tl.log2(l)
            part_rows = out_rows * max_splits + split
            tl.store(part_ptr + part_rows[:, None] * HEAD_DIM + dims[None, :], part, mask=out_mask)
            tl.store(lse_ptr + part_rows, part_lse, mask=row_valid)


@triton.jit
def _fold_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    kv_indptr_ptr,
    last_page_len_ptr,
    max_splits,
    block_size,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    KV_SPLIT: tl.constexpr,
):
    # Grid: (seqs,); a decode, so token = sequence. Its heads' splits, folded in order.
    seq = tl.program_id(0)
    context_len = (tl.load(kv_indptr_ptr + seq + 1) - tl.load(kv_indptr_ptr + seq) - 1) * block_size + tl.load(
        last_page_len_ptr + seq
    )
    heads = tl.arange(0, BLOCK_H)
    head_valid = heads < num_heads
    dims = tl.arange(0, BLOCK_D)
    mask = head_valid[:, None] & (dims < HEAD_DIM)[None, :]
    rows = seq.to(tl.int64) * num_heads + heads
    out = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    top = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    for split in range(0, tl.cdiv(context_len, KV_SPLIT)):  # every split starts at or before the token
        part_rows = rows * max_splits + split
        part = tl.load(part_ptr + part_rows[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
        part_lse = tl.load(lse_ptr + part_rows, mask=head_valid, other=0.0)
        out, top, total = _fold(out, top, total, part, part_lse, head_valid)
    tl.store(
        out_ptr + rows[:, None] * HEAD_DIM + dims[None, :],
        (out / total[:, None]).to(out_ptr.dtype.element_ty),
        mask=mask,
    )


def attend(
    q: torch.Tensor,
    cache: torch.Tensor,
    paged: Paged,
    scale: float,
    out: torch.Tensor,
    tiles: ExtendTiles | None = None,
    query_start: torch.Tensor | None = None,
    split_programs: int = 0,
    max_splits: int = 0,
) -> torch.Tensor:
    """Causal attention of each new token over its sequence's cached keys (its own included), into
    `out` [T, heads, head_dim]. q: [T, heads, head_dim]; cache: [blocks, 2, block_size, kv_heads,
    head_dim]. A decode step (one token per sequence) gives no `tiles`; an extend step gives its
    `tiles` and `query_start` [S+1]. A decode with `split_programs` spreads each sequence's splits
    over that many programs per KV head, with room for `max_splits` splits (at least its longest
    context's), and folds them in a second kernel."""
    tokens, heads, head_dim = q.shape
    if not tokens:
        return out
    kv_heads = cache.shape[3]
    decode = tiles is None
    splitting = decode and split_programs > 0
    config = attention_config(heads // kv_heads, head_dim, decode=decode and not splitting)
    if tiles is not None and tiles.tokens != config.block_m // (heads // kv_heads):
        raise ValueError(
            f"tiles of {tiles.tokens} tokens, where this model's attention takes {config.block_m // (heads // kv_heads)}"
        )
    part = lse = out  # read only when splitting
    if splitting:
        part = torch.empty(tokens, heads, max_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(tokens, heads, max_splits, dtype=torch.float32, device=q.device)
    grid = (tokens if decode else len(tiles.seq), kv_heads, split_programs if splitting else 1)
    _attention_kernel[grid](
        out_ptr=out,
        part_ptr=part,
        lse_ptr=lse,
        max_splits=max_splits,
        KV_SPLIT=KV_SPLIT,
        SPLIT_PROGRAMS=split_programs if splitting else 0,
        enable_fp_fusion=False,
        **tile_arguments(q, cache, paged, tiles, query_start, scale, config),
    )
    if splitting:
        _fold_kernel[(tokens,)](
            part,
            lse,
            out,
            paged.kv_indptr,
            paged.last_page_len,
            max_splits,
            cache.shape[2],
            heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d(head_dim),
            BLOCK_H=triton.next_power_of_2(heads),
            KV_SPLIT=KV_SPLIT,
            num_warps=4,
            enable_fp_fusion=False,
        )
    return out
