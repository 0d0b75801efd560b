"""The GPU sampler's passes split over a program per block of a row, for small batches: a few rows
would leave most of the GPU idle while one program per row walks the vocabulary
(gpu/sampler_kernel.py says how a row is drawn, and when a batch takes these passes).

Each pass is split over a program per block of the row (chunk_kernel), whose partial results one
program per row combines (combine_kernel) into the row's state: its top logit, softmax
denominator, candidate and whether it is still looking. Part arrays are [field, row, chunk] (a
chunk is a block), state arrays [field, row].
"""

import torch
import triton
import triton.language as tl

from gpu.sampler_rows import (
    BLOCK,
    NUM_WARPS,
    above_candidate,
    block_softmax,
    first_draws,
    fold_softmax,
    gumbel,
    in_head,
    row_draw,
    row_filters,
    scaled,
    still_looking_after_first,
)

# When rows of the batch have filters checked in rejection passes, the first SPLIT_ROUNDS of those
# are split too (most rows are done by then).
SPLIT_ROUNDS = 2


@triton.jit(do_not_specialize=["rows"])
def chunk_kernel(
    logits_ptr,
    stride,
    vocab,
    temperature_ptr,
    seed_ptr,
    position_ptr,
    bounds_ptr,
    state_f_ptr,
    state_i_ptr,
    part_f_ptr,
    part_i_ptr,
    rows,
    HAS_HEADS: tl.constexpr,
    FIRST: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """One block of a pass: with FIRST, its top, its softmax sum relative to that top and its best
    draw; else the tokens in it that rank above the row's candidate, their mass and best draw."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    base = logits_ptr + row.to(tl.int64) * stride
    temperature, greedy, row_key = row_draw(row, temperature_ptr, seed_ptr, position_ptr)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab
    slot = row * CHUNKS + chunk
    part = rows * CHUNKS  # the distance between two fields of a part array
    if FIRST:  # (a compile-time branch; the next is taken at run time)
        x = scaled(base, offs, mask, temperature)
        block_top, block_sum = block_softmax(x)
        floor = tl.load(bounds_ptr + 2 * row) if HAS_HEADS else float("-inf")
        y = first_draws(x, mask, greedy, row_key, offs, floor)
        tl.store(part_f_ptr + slot, block_top)
        tl.store(part_f_ptr + part + slot, block_sum)
        tl.store(part_f_ptr + 2 * part + slot, tl.max(y, axis=0))
        tl.store(part_i_ptr + slot, chunk * BLOCK + tl.argmax(y, axis=0))
    elif tl.load(state_i_ptr + rows + row) != 0:  # the row is still looking
        candidate = tl.load(state_i_ptr + row).to(tl.int32)
        candidate_x = tl.math.div_rn(tl.load(base + candidate), temperature)
        top = tl.load(state_f_ptr + row)
        x = scaled(base, offs, mask, temperature)
        ranks_above = above_candidate(x, offs, mask, candidate_x, candidate)
        y = tl.where(ranks_above, x + gumbel(row_key, offs), float("-inf"))
        tl.store(part_f_ptr + part + slot, tl.sum(tl.where(ranks_above, tl.exp(x - top), 0.0), axis=0))
        tl.store(part_f_ptr + 2 * part + slot, tl.max(y, axis=0))
        tl.store(part_i_ptr + slot, chunk * BLOCK + tl.argmax(y, axis=0))
        tl.store(part_i_ptr + part + slot, tl.sum(ranks_above.to(tl.int32), axis=0))


@triton.jit(do_not_specialize=["rows", "num_chunks"])
def combine_kernel(
    logits_ptr,
    stride,
    vocab,
    temperature_ptr,
    top_p_ptr,
    top_k_ptr,
    min_p_ptr,
    seed_ptr,
    position_ptr,
    head_ptr,
    bounds_ptr,
    state_f_ptr,
    state_i_ptr,
    part_f_ptr,
    part_i_ptr,
    rows,
    num_chunks,
    HAS_HEADS: tl.constexpr,
    FIRST: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """A pass's blocks combined into the row's state, as the one-program pass leaves it: sums are
    folded block by block, in order, as that pass adds them."""
    row = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS)
    valid = chunks < num_chunks
    first_slot = row * CHUNKS
    part = rows * CHUNKS
    temperature, greedy, row_key = row_draw(row, temperature_ptr, seed_ptr, position_ptr)
    keep, top_p, log_min_p, floor, outside = row_filters(
        row, vocab, top_p_ptr, top_k_ptr, min_p_ptr, head_ptr, bounds_ptr, HAS_HEADS
    )
    base = logits_ptr + row.to(tl.int64) * stride
    # The best draw of the pass; on a tie the first block's, as the one-program pass keeps the first.
    bests = tl.load(part_f_ptr + 2 * part + first_slot + chunks, mask=valid, other=float("-inf"))
    next_candidate = tl.load(part_i_ptr + first_slot + tl.argmax(bests, axis=0))
    if FIRST:
        top = float("-inf")
        denominator = 0.0
        for chunk in range(0, num_chunks):
            block_top = tl.load(part_f_ptr + first_slot + chunk)
            block_sum = tl.load(part_f_ptr + part + first_slot + chunk)
            top, denominator = fold_softmax(top, denominator, block_top, block_sum)
        candidate_x = tl.math.div_rn(tl.load(base + next_candidate), temperature)
        looking = still_looking_after_first(greedy, vocab, keep, top_p, log_min_p, floor, outside, top, candidate_x)
        tl.store(state_f_ptr + row, top)
        tl.store(state_f_ptr + rows + row, denominator)
        tl.store(state_i_ptr + row, next_candidate.to(tl.int64))
        tl.store(state_i_ptr + rows + row, looking.to(tl.int64))
    elif tl.load(state_i_ptr + rows + row) != 0:
        candidate = tl.load(state_i_ptr + row).to(tl.int32)
        candidate_x = tl.math.div_rn(tl.load(base + candidate), temperature)
        top = tl.load(state_f_ptr + row)
        denominator = tl.load(state_f_ptr + rows + row)
        above = tl.sum(tl.load(part_i_ptr + part + first_slot + chunks, mask=valid, other=0), axis=0)
        mass_above = 0.0
        for chunk in range(0, num_chunks):  # a block with none above adds 0, as the one-program pass skips it
            mass_above += tl.load(part_f_ptr + part + first_slot + chunk)
        kept = in_head(above, mass_above, candidate_x, keep, top_p, denominator, top, log_min_p)
        looking = ~(kept | (above == 0))
        tl.store(state_i_ptr + row, tl.where(looking, next_candidate, candidate).to(tl.int64))
        tl.store(state_i_ptr + rows + row, looking.to(tl.int64))


def split_passes(row_args: tuple, rejections: bool, has_heads: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The first pass, then SPLIT_ROUNDS rejection passes if `rejections`, each split over
    a program per block; returns the rows' state (float32 [2, S]: top, denominator; int64 [2, S]:
    candidate, looking) for gpu/sampler_kernel.py's one-program pass to finish from (most rows are done by then)."""
    logits, stride, vocab, temperature, _, _, _, seed, position, _, bounds = row_args
    rows = logits.shape[0]
    block = min(BLOCK, triton.next_power_of_2(vocab))
    num_chunks = triton.cdiv(vocab, block)
    chunks = triton.next_power_of_2(num_chunks)
    device = logits.device
    state_f = torch.empty(2, rows, dtype=torch.float32, device=device)
    state_i = torch.empty(2, rows, dtype=torch.int64, device=device)
    part_f = torch.empty(3, rows, chunks, dtype=torch.float32, device=device)
    part_i = torch.empty(2, rows, chunks, dtype=torch.int32, device=device)
    for first in [True] + [False] * (SPLIT_ROUNDS if rejections else 0):
        chunk_kernel[(rows, num_chunks)](
            logits,
            stride,
            vocab,
            temperature,
            seed,
            position,
            bounds,
            state_f,
            state_i,
            part_f,
            part_i,
            rows,
            HAS_HEADS=has_heads,
            FIRST=first,
            BLOCK=block,
            CHUNKS=chunks,
            num_warps=NUM_WARPS,  # the one-program pass's blocks and warps
        )
        combine_kernel[(rows,)](
            *row_args,
            state_f,
            state_i,
            part_f,
            part_i,
            rows,
            num_chunks,
            HAS_HEADS=has_heads,
            FIRST=first,
            CHUNKS=chunks,
            num_warps=1,
        )
    return state_f, state_i
