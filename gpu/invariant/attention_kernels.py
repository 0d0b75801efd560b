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
tensor-core product (attend_keys' row sums by dot), summed in the instruction's order whatever the
rows of the tile and the warps it is spread over: a decode's small tile gives a prompt's bits.
Key tiles past a token's position are masked to exact zeros, and splits past it are left out of
its fold. Every launch disables floating-point fusion, so no compiler contracts a fold's multiply
and add differently in the two kernels. TRITON_INTERPRET=1 runs these on the CPU for tests.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from gpu.attention.triton_kernels import LOG2_E, ExtendTiles, attend_keys

KV_SPLIT = 256  # keys per split; a multiple of every BLOCK_N


class AttentionConfig(NamedTuple):
    block_m: int  # rows of a tile: tokens x query heads of one KV head
    block_n: int  # keys per step of a split's loop
    num_warps: int
    num_stages: int


def attention_config(group: int, head_dim: int, decode: bool = False) -> AttentionConfig:
    """A model's attention tiles: 64 rows (a prompt chunk's tokens x the group's query heads) in 4
    warps, 64 keys a step (32 past head_dim 128, in 8 warps, for the registers). A `decode` batch
    whose splits are not spread over programs holds only each token's group in a tile: 16 rows in
    2 warps (on an H200, llama-3.1-8b's decode of 256 sequences at 600 to 1,400 keys took 0.82x the
    time in them that it took in the prefill's tiles; a batch of one, spread, took 1.2x, so spread
    splits keep the prefill's). The key step is the same, which with the row sums by dot
    (attend_keys) keeps the bits."""
    wide = head_dim > 128
    if decode:
        return AttentionConfig(max(16, triton.next_power_of_2(group)), 32 if wide else 64, 4 if wide else 2, 2)
    return AttentionConfig(max(64, triton.next_power_of_2(group)), 32 if wide else 64, 8 if wide else 4, 2)


@triton.jit
def _split_state(
    q,
    q_pos,
    first_pos,
    cache_ptr,
    kv_indices_ptr,
    page_first,
    split_start,
    split_end,
    qk_scale,
    block_size,
    page_stride,
    kv_stride,
    slot_stride,
    kv_head_offset,
    dims,
    dim_valid,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One split's keys split_start ..< split_end from a fresh state: each row's normalized output
    [BLOCK_M, BLOCK_D] and log2-sum-exp2 [BLOCK_M] (NaN and -inf for a row that sees none of them).
    Key tiles every row sees whole (up to first_pos, the tile's first token) skip the mask."""
    seen_by_all = tl.maximum(tl.minimum(split_end, first_pos + 1) - split_start, 0)
    unmasked_end = split_start + seen_by_all // BLOCK_N * BLOCK_N
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, m, l = attend_keys(
        acc, m, l, q, q_pos, cache_ptr, kv_indices_ptr, page_first, split_start, unmasked_end, qk_scale,
        block_size, page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid, BLOCK_N, DOT_PRECISION,
        False, True,
    )  # fmt: skip
    acc, m, l = attend_keys(
        acc, m, l, q, q_pos, cache_ptr, kv_indices_ptr, page_first, unmasked_end, split_end, qk_scale,
        block_size, page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid, BLOCK_N, DOT_PRECISION,
        True, True,
    )  # fmt: skip
    return acc / l[:, None], m + tl.log2(l)


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
    kv_head = tl.program_id(1)
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
    q_pos = context_len - q_len + token  # padding rows sit past the context and see every key
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q_offsets = (q_start + token).to(tl.int64)[:, None] * q_token_stride + head[:, None] * q_head_stride + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    first_pos = context_len - q_len + tile * TOKENS
    key_end = tl.minimum(context_len, first_pos + TOKENS)  # past the tile's last token's position
    kv_head_offset = kv_head * kv_head_stride
    out_rows = (q_start + token).to(tl.int64) * num_heads + head  # [T, heads] row of each tile row
    out_mask = row_valid[:, None] & dim_valid[None, :]

    if SPLIT_PROGRAMS == 0:  # every split here, folded as it is made
        out = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        top = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        for split_start in range(0, key_end, KV_SPLIT):
            split_end = tl.minimum(split_start + KV_SPLIT, key_end)
            part, part_lse = _split_state(
                q, q_pos, first_pos, cache_ptr, kv_indices_ptr, page_first, split_start, split_end,
                qk_scale, block_size, page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid,
                BLOCK_M, BLOCK_D, BLOCK_N, DOT_PRECISION,
            )  # fmt: skip
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
            part, part_lse = _split_state(
                q, q_pos, first_pos, cache_ptr, kv_indices_ptr, page_first, split_start, split_end,
                qk_scale, block_size, page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid,
                BLOCK_M, BLOCK_D, BLOCK_N, DOT_PRECISION,
            )  # fmt: skip
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


class Paged(NamedTuple):
    """Where the step's sequences' keys are: the paged-KV metadata every launch reads."""

    kv_indptr: torch.Tensor  # [S+1] int32
    kv_indices: torch.Tensor  # [P] int32
    last_page_len: torch.Tensor  # [S] int32


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
    if q.stride(-1) != 1:
        q = q.contiguous()
    part = lse = out  # read only when splitting
    if splitting:
        part = torch.empty(tokens, heads, max_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(tokens, heads, max_splits, dtype=torch.float32, device=q.device)
    grid = (tokens if decode else len(tiles.seq), kv_heads, split_programs if splitting else 1)
    _attention_kernel[grid](
        q,
        out,
        part,
        lse,
        cache,
        paged.kv_indptr if decode else query_start,
        paged.kv_indptr,
        paged.kv_indices,
        paged.last_page_len,
        paged.kv_indptr if decode else tiles.seq,  # decode reads no tiles: any int32 pointer stands in
        paged.kv_indptr if decode else tiles.index,
        max_splits,
        scale * LOG2_E,
        cache.shape[2],
        q.stride(0),
        q.stride(1),
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        cache.stride(3),
        GROUP=heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        KV_SPLIT=KV_SPLIT,
        SPLIT_PROGRAMS=split_programs if splitting else 0,
        DECODE=decode,
        # float32 must stay float32: TF32 would cost it the precision it was chosen for.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        enable_fp_fusion=False,
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
            BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
            BLOCK_H=triton.next_power_of_2(heads),
            KV_SPLIT=KV_SPLIT,
            num_warps=4,
            enable_fp_fusion=False,
        )
    return out
