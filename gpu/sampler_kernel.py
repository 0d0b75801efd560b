"""The sampler on the GPU: the tokens of `gpu.sampler.sample`'s torch path, without its [S, V] passes.

The torch path sorts every row for top-k and top-p and materializes the Gumbel noise as [S, V]
int64 tensors: up to half a decode step at 256 rows of 128K logits
(docs/journal/benchmarks.md, section "Sampling without sorting"). Here one program per row streams
its logits, hashing each token's noise as it goes, and finds the same token without sorting:

- The drawn token is argmax(scaled logit + Gumbel noise) over the tokens that the filters keep, and
  every filter keeps a head of the row in (logit descending, index ascending) order. So start from
  the argmax over all tokens; while the candidate is outside the kept head, every kept token ranks
  above it: take the argmax over the tokens that rank above the candidate instead. With the same
  noise throughout, the last candidate is the torch path's draw.
- One pass per candidate counts the tokens above it and their probability mass (top-k and top-p)
  and finds the next candidate. Most rows take one or two passes; a small top-k over many nearly
  equal tokens takes many (top-k 50 of 128K flat logits; still quicker than a sort).
- Top-p over the top-k head (vLLM's order, as the torch path) needs the head's total mass: for rows
  with both, gpu/sampler_heads.py works the head out from the row's best logits (torch.topk's),
  and the first pass draws among the tokens at or above the head's last logit, so such a row needs
  a rejection pass only where tokens on that logit tie across the head's end. Rows with a top-k
  alone do without torch.topk: on peaked logits, as a trained model gives, their rejection passes
  cost less than it does.
- A few rows would leave most of the GPU idle, one program walking each row. A batch of up to
  SPLIT_ROWS rows splits the first pass (and, when it has rows that need them, the next
  SPLIT_ROUNDS rejection passes) over a program per block of the row (32 for a 128K vocabulary);
  one program per row combines their results, and the one-program loop finishes what rows are
  still looking after that.
  Both ways reduce the same blocks with the same code, then fold the blocks' sums in the same
  order, so a row draws the same token whichever way its batch went, even where top-p's boundary
  falls within rounding.
"""

import torch
import triton
import triton.language as tl

from gpu.sampler import SamplingTensors
from gpu.sampler_heads import heads

BLOCK = 4096  # tokens a program reads at a time
NUM_WARPS = 16
# Batches of at most SPLIT_ROWS rows split each row's first pass, and, when rows of the batch have
# filters checked in rejection passes, SPLIT_ROUNDS of those, over a program per BLOCK of the row.
SPLIT_ROWS = 16
SPLIT_ROUNDS = 2

# splitmix64's constants, as gpu/sampler.py's hash uses them.
_GOLDEN = tl.constexpr(0x9E3779B97F4A7C15)
_MIX_A = tl.constexpr(0xBF58476D1CE4E5B9)
_MIX_B = tl.constexpr(0x94D049BB133111EB)


@triton.jit
def _mix64(z):
    # splitmix64's finalizer on uint64, as gpu/sampler.py's _mix64 computes it on int64.
    z = (z ^ (z >> 30)) * _MIX_A
    z = (z ^ (z >> 27)) * _MIX_B
    return z ^ (z >> 31)


@triton.jit
def _gumbel(row_key, offs):
    """The Gumbel noise of tokens `offs` of the row keyed `row_key`: gpu.sampler's, from the same hash."""
    bits = _mix64(row_key + (offs + 1).to(tl.uint64) * _GOLDEN)
    u = ((bits >> 41) * 2 + 1).to(tl.float32) * (1.0 / (1 << 24))  # as gpu.sampler.uniform_noise
    return -tl.log(-tl.log(u))


@triton.jit
def _scaled(base, offs, mask, temperature):
    # IEEE division, as torch divides: the kernel's scaled logits are the torch path's.
    return tl.math.div_rn(tl.load(base + offs, mask=mask, other=float("-inf")), temperature)


@triton.jit
def _row_draw(row, temperature_ptr, seed_ptr, position_ptr):
    """The row's temperature (1 for a greedy row), whether it is greedy, and its noise's key."""
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature <= 0
    seed = tl.load(seed_ptr + row).to(tl.uint64, bitcast=True)
    position = tl.load(position_ptr + row).to(tl.uint64, bitcast=True)
    return tl.where(greedy, 1.0, temperature), greedy, _mix64(_mix64(seed + _GOLDEN) + position * _GOLDEN)


@triton.jit
def _row_filters(row, vocab, top_p_ptr, top_k_ptr, min_p_ptr, head_ptr, bounds_ptr, HAS_HEADS: tl.constexpr):
    """The kept head: its size by rank, the share of the probability mass above its last token
    (top-p; 1 where the size says it all), the log of min-p, and the scaled logit of the head's
    last token and the best scaled logit outside the head, where heads() worked the head out (rows
    with both top-k and top-p, given HAS_HEADS; -inf elsewhere)."""
    top_k = tl.load(top_k_ptr + row)
    keep = tl.where(top_k > 0, tl.minimum(top_k, vocab), vocab)
    top_p = tl.load(top_p_ptr + row)
    floor = float("-inf")
    outside = float("-inf")
    if HAS_HEADS:
        head = tl.load(head_ptr + row)
        keep = tl.where(head > 0, head, keep)
        top_p = tl.where(head > 0, 1.0, top_p)
        floor = tl.load(bounds_ptr + 2 * row)
        outside = tl.load(bounds_ptr + 2 * row + 1)
    return keep, top_p, tl.log(tl.load(min_p_ptr + row)), floor, outside


@triton.jit
def _first_draws(x, mask, greedy, row_key, offs, floor):
    """A block's draws in the first pass: a greedy row's scaled logits, else with their noise, over
    the tokens at or above the row's floor (below it, a token is outside the head)."""
    return tl.where(mask & (x >= floor), tl.where(greedy, x, x + _gumbel(row_key, offs)), float("-inf"))


@triton.jit
def _still_looking_after_first(greedy, vocab, keep, top_p, log_min_p, floor, outside, top, candidate_x):
    """Whether the first pass's candidate needs a pass to check it. Not for a greedy row, nor where
    every filter can be checked from its logit alone: with no top-p left (none, or folded into a
    worked-out head), no top-k but a worked-out head's, above every token outside the head (so
    inside it; only a tie across the head's end needs the rank) and at or above min-p's threshold."""
    unfiltered = (keep >= vocab) & (top_p >= 1.0) & (log_min_p == float("-inf"))
    kept = (
        (top_p >= 1.0)
        & ((keep >= vocab) | (floor > float("-inf")))
        & (candidate_x > outside)
        & (candidate_x >= top + log_min_p)
    )
    return ~(greedy | unfiltered | kept)


@triton.jit
def _ranks_above(x, offs, mask, candidate_x, candidate):
    """The tokens ranked above the candidate, in (scaled logit descending, index ascending) order."""
    return mask & ((x > candidate_x) | ((x == candidate_x) & (offs < candidate)))


@triton.jit
def _kept(above, mass_above, candidate_x, keep, top_p, denominator, top, log_min_p):
    """Whether the candidate, with `above` tokens of `mass_above` ranked above it, is in the head."""
    return (above < keep) & ((top_p >= 1.0) | (mass_above < top_p * denominator)) & (candidate_x >= top + log_min_p)


@triton.jit
def _block_softmax(x):
    """A block's largest scaled logit, and its softmax sum relative to it."""
    top = tl.max(x, axis=0)
    return top, tl.sum(tl.exp(x - tl.where(top == float("-inf"), 0.0, top)), axis=0)


@triton.jit
def _fold_softmax(top, denominator, block_top, block_sum):
    """The row's top and softmax denominator so far with one more block's folded in."""
    new_top = tl.maximum(top, block_top)
    shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # a row of -inf so far adds nothing
    return new_top, denominator * tl.exp(top - shift) + block_sum * tl.exp(block_top - shift)


@triton.jit(do_not_specialize=["rows"])  # one compiled kernel for every batch size
def _sample_kernel(
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
    rows,
    out_ptr,
    HAS_HEADS: tl.constexpr,
    FROM_STATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride
    temperature, greedy, row_key = _row_draw(row, temperature_ptr, seed_ptr, position_ptr)
    keep, top_p, log_min_p, floor, outside = _row_filters(
        row, vocab, top_p_ptr, top_k_ptr, min_p_ptr, head_ptr, bounds_ptr, HAS_HEADS
    )

    if FROM_STATE:  # the split passes below went first: go on from where they left the row
        top = tl.load(state_f_ptr + row)
        denominator = tl.load(state_f_ptr + rows + row)
        candidate = tl.load(state_i_ptr + row).to(tl.int32)
        looking = tl.load(state_i_ptr + rows + row) != 0
    else:
        # Pass 1: the row's largest scaled logit and softmax denominator, and the argmax over the
        # tokens at or above its floor.
        top = float("-inf")
        denominator = 0.0
        best = float("-inf")
        candidate = 0
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            x = _scaled(base, offs, mask, temperature)
            block_top, block_sum = _block_softmax(x)
            top, denominator = _fold_softmax(top, denominator, block_top, block_sum)
            y = _first_draws(x, mask, greedy, row_key, offs, floor)
            block_best = tl.max(y, axis=0)
            candidate = tl.where(block_best > best, start + tl.argmax(y, axis=0), candidate)
            best = tl.maximum(best, block_best)
        candidate_x = tl.math.div_rn(tl.load(base + candidate), temperature)
        looking = _still_looking_after_first(greedy, vocab, keep, top_p, log_min_p, floor, outside, top, candidate_x)

    # Then one pass per candidate while it is outside the kept head (the best token always stays).
    while looking:
        candidate_x = tl.math.div_rn(tl.load(base + candidate), temperature)
        above = 0
        mass_above = 0.0
        best = float("-inf")
        next_candidate = candidate
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            x = _scaled(base, offs, mask, temperature)
            ranks_above = _ranks_above(x, offs, mask, candidate_x, candidate)
            block_above = tl.sum(ranks_above.to(tl.int32), axis=0)
            if block_above > 0:  # after a rejection or two most blocks have none: skip their noise
                above += block_above
                mass_above += tl.sum(tl.where(ranks_above, tl.exp(x - top), 0.0), axis=0)
                y = tl.where(ranks_above, x + _gumbel(row_key, offs), float("-inf"))
                block_best = tl.max(y, axis=0)
                next_candidate = tl.where(block_best > best, start + tl.argmax(y, axis=0), next_candidate)
                best = tl.maximum(best, block_best)
        kept = _kept(above, mass_above, candidate_x, keep, top_p, denominator, top, log_min_p)
        looking = ~(kept | (above == 0))
        candidate = tl.where(looking, next_candidate, candidate)
    tl.store(out_ptr + row, candidate.to(tl.int64))


# A few rows leave most of the GPU idle while one program per row walks the vocabulary: there each
# pass is split over a program per block of the row (_chunk_kernel), whose partial results one
# program per row combines (_combine_kernel) into the row's state: its top logit, softmax
# denominator, candidate and whether it is still looking. Part arrays are [field, row, chunk] (a
# chunk is a block), state arrays [field, row].


@triton.jit(do_not_specialize=["rows"])
def _chunk_kernel(
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
    temperature, greedy, row_key = _row_draw(row, temperature_ptr, seed_ptr, position_ptr)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab
    slot = row * CHUNKS + chunk
    part = rows * CHUNKS  # the distance between two fields of a part array
    if FIRST:  # (a compile-time branch; the next is taken at run time)
        x = _scaled(base, offs, mask, temperature)
        block_top, block_sum = _block_softmax(x)
        floor = tl.load(bounds_ptr + 2 * row) if HAS_HEADS else float("-inf")
        y = _first_draws(x, mask, greedy, row_key, offs, floor)
        tl.store(part_f_ptr + slot, block_top)
        tl.store(part_f_ptr + part + slot, block_sum)
        tl.store(part_f_ptr + 2 * part + slot, tl.max(y, axis=0))
        tl.store(part_i_ptr + slot, chunk * BLOCK + tl.argmax(y, axis=0))
    elif tl.load(state_i_ptr + rows + row) != 0:  # the row is still looking
        candidate = tl.load(state_i_ptr + row).to(tl.int32)
        candidate_x = tl.math.div_rn(tl.load(base + candidate), temperature)
        top = tl.load(state_f_ptr + row)
        x = _scaled(base, offs, mask, temperature)
        ranks_above = _ranks_above(x, offs, mask, candidate_x, candidate)
        y = tl.where(ranks_above, x + _gumbel(row_key, offs), float("-inf"))
        tl.store(part_f_ptr + part + slot, tl.sum(tl.where(ranks_above, tl.exp(x - top), 0.0), axis=0))
        tl.store(part_f_ptr + 2 * part + slot, tl.max(y, axis=0))
        tl.store(part_i_ptr + slot, chunk * BLOCK + tl.argmax(y, axis=0))
        tl.store(part_i_ptr + part + slot, tl.sum(ranks_above.to(tl.int32), axis=0))


@triton.jit(do_not_specialize=["rows", "num_chunks"])
def _combine_kernel(
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
    temperature, greedy, row_key = _row_draw(row, temperature_ptr, seed_ptr, position_ptr)
    keep, top_p, log_min_p, floor, outside = _row_filters(
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
            top, denominator = _fold_softmax(top, denominator, block_top, block_sum)
        candidate_x = tl.math.div_rn(tl.load(base + next_candidate), temperature)
        looking = _still_looking_after_first(greedy, vocab, keep, top_p, log_min_p, floor, outside, top, candidate_x)
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
        kept = _kept(above, mass_above, candidate_x, keep, top_p, denominator, top, log_min_p)
        looking = ~(kept | (above == 0))
        tl.store(state_i_ptr + row, tl.where(looking, next_candidate, candidate).to(tl.int64))
        tl.store(state_i_ptr + rows + row, looking.to(tl.int64))


def sample_on_gpu(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """One token per row, the token gpu.sampler.sample's torch path draws (but where rounding moves
    a token across a top-p or min-p boundary). logits: [S, V] float32 -> [S] int64"""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if not rows:
        return out
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    has_heads = params.largest_joint_top_k > 0
    sizes, bounds = heads(logits, params) if has_heads else (out, out)  # unread without heads
    row_args = (
        logits,
        logits.stride(0),
        vocab,
        params.temperature,
        params.top_p,
        params.top_k,
        params.min_p,
        params.seed,
        params.position,
        sizes,
        bounds,
    )
    state_f = state_i = out  # pointers the kernel reads only after a split (any will do)
    split = rows <= SPLIT_ROWS
    if split:
        state_f, state_i = _split_passes(row_args, params.any_rejections, has_heads)
    _sample_kernel[(rows,)](
        *row_args,
        state_f,
        state_i,
        rows,
        out,
        HAS_HEADS=has_heads,
        FROM_STATE=split,
        BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
        num_warps=NUM_WARPS,
    )
    return out


def _split_passes(row_args: tuple, rejections: bool, has_heads: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The first pass, then SPLIT_ROUNDS rejection passes if `rejections`, each split over
    a program per block; returns the rows' state (float32 [2, S]: top, denominator; int64 [2, S]:
    candidate, looking) for _sample_kernel to finish from (most rows are done by then)."""
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
        _chunk_kernel[(rows, num_chunks)](
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
        _combine_kernel[(rows,)](
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


def compile_sampler(vocab_size: int, device: torch.device) -> None:
    """Compiles every variant of the kernels for this vocabulary now: split batches with rejection
    passes, without and with sized heads (a row with both top-k and top-p beside one with top-p
    alone), and batches of a program a row, without and with heads. Compiled on a first sampled step
    instead, they would hold up that step by seconds."""
    for top_k in ([0], [2, 0], [0] * (SPLIT_ROWS + 1), [2] * (SPLIT_ROWS + 1)):
        rows = len(top_k)
        logits = torch.zeros(rows, vocab_size, device=device)
        sample_on_gpu(
            logits,
            SamplingTensors.from_lists([1.0] * rows, [0.5] * rows, top_k, [0.0] * rows, [0] * rows, [0] * rows, device),
        )
