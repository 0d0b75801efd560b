"""What both Triton paged-attention kernels are made of: the `triton` backend's (triton_kernels.py)
and the batch-invariant one of `--deterministic` (gpu/invariant/attention_kernels.py).

A program takes a tile of one sequence's new tokens for one KV head; the tile's rows are (token,
query head of the KV head's group) pairs, so each K/V page is read once for the whole GQA group and
even a single decode token makes a tensor-core dot. `load_query_tile` loads a program's tile (cut
on the host by triton_launch.py), and `attend_key_range` runs its online softmax in base 2 over a
range of keys, gathered through each sequence's block table (kv_indptr + kv_indices); only the key
tiles at the causal edge pay for a mask. Triton inlines these into the kernels that call them.
"""

import triton
import triton.language as tl

LOG2_E = 1.4426950408889634  # scores are kept in base 2: exp2 is the GPU's native exponential


@triton.jit
def load_query_tile(
    q_ptr,
    query_start_ptr,
    kv_indptr_ptr,
    last_page_len_ptr,
    tile_seq_ptr,
    tile_index_ptr,
    block_size,
    q_token_stride,
    q_head_stride,
    kv_head_stride,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DECODE: tl.constexpr,
):
    """The program's tile: program_id(0) picks it (in a decode, one token per sequence: tile =
    sequence), program_id(1) its KV head. Returns its queries q [BLOCK_M, BLOCK_D]; per row its
    token's position q_pos, whether it is a real row (row_valid) and its row of the [T, heads]
    output (out_rows) [BLOCK_M]; dims and dim_valid [BLOCK_D]; first_pos, the position of the
    tile's first token, and key_end, past its last token's; the sequence's first block's place in
    kv_indices (page_first) and its number of keys (context_len, cached and new); and its KV
    head's offset in a block of the cache."""
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
    # A new token sits at context_len - q_len + token and sees the keys up to it. Padding rows get
    # positions past the context, so no row ever sees only masked keys (no -inf - -inf).
    q_pos = context_len - q_len + token
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q_offsets = (q_start + token).to(tl.int64)[:, None] * q_token_stride + head[:, None] * q_head_stride + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    first_pos = context_len - q_len + tile * TOKENS
    key_end = tl.minimum(context_len, first_pos + TOKENS)
    kv_head_offset = kv_head * kv_head_stride
    out_rows = (q_start + token).to(tl.int64) * num_heads + head
    return q, q_pos, row_valid, out_rows, dims, dim_valid, first_pos, key_end, page_first, context_len, kv_head_offset


@triton.jit
def attend_key_range(
    q,
    q_pos,
    first_pos,
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
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ROW_SUMS_BY_DOT: tl.constexpr = False,
):
    """Each row's online softmax over keys key_start ..< key_end, from a fresh state: acc
    [BLOCK_M, BLOCK_D], m (the running max score) and l (the running sum of exp2(score - m))
    [BLOCK_M]; acc / l is its output, m + log2(l) its log2-sum-exp2 (NaN and -inf for a row that
    sees none of the keys). Key tiles every row sees whole (up to first_pos, the tile's first
    token) skip the causal mask. ROW_SUMS_BY_DOT: each row's sum of exp2 is a product with a ones
    matrix, summed in the tensor-core instruction's order as P @ V is, where tl.sum's order follows
    the tile's spread over warps (a row's maximum is exact in any order): a row's result is then
    the same bits whatever the tile's rows and warps."""
    seen_by_all = tl.maximum(tl.minimum(key_end, first_pos + 1) - key_start, 0)
    unmasked_end = key_start + seen_by_all // BLOCK_N * BLOCK_N
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, m, l = _attend_keys(
        acc, m, l, q, q_pos, cache_ptr, kv_indices_ptr, page_first, key_start, unmasked_end, qk_scale,
        block_size, page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid, BLOCK_N, DOT_PRECISION,
        False, ROW_SUMS_BY_DOT,
    )  # fmt: skip
    acc, m, l = _attend_keys(
        acc, m, l, q, q_pos, cache_ptr, kv_indices_ptr, page_first, unmasked_end, key_end, qk_scale,
        block_size, page_stride, kv_stride, slot_stride, kv_head_offset, dims, dim_valid, BLOCK_N, DOT_PRECISION,
        True, ROW_SUMS_BY_DOT,
    )  # fmt: skip
    return acc, m, l


@triton.jit
def _attend_keys(
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
    ROW_SUMS_BY_DOT: tl.constexpr,
):
    # Online softmax over keys key_start ..< key_end: acc [BLOCK_M, BLOCK_D], m and l [BLOCK_M].
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
        p_low = p.to(v.dtype)  # the operand of P @ V (and of the row sums by dot)
        if ROW_SUMS_BY_DOT:
            ones = tl.full([BLOCK_N, 16], 1.0, v.dtype)
            l = l * alpha + tl.max(tl.dot(p_low, ones, input_precision=DOT_PRECISION), 1)
        else:
            l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p_low, v, input_precision=DOT_PRECISION)
        m = m_new
    return acc, m, l
