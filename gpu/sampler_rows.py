"""The arithmetic of one row that every pass of the GPU sampler shares: the one-program pass
(gpu/sampler_kernel.py) and the split passes (gpu/sampler_split.py) reduce a row's blocks with
these same functions, so a row draws the same token whichever way its batch went.
"""

import triton
import triton.language as tl

BLOCK = 4096  # tokens a program reads at a time
NUM_WARPS = 16

# splitmix64's constants, as gpu/sampler.py's hash uses them.
GOLDEN = tl.constexpr(0x9E3779B97F4A7C15)
MIX_A = tl.constexpr(0xBF58476D1CE4E5B9)
MIX_B = tl.constexpr(0x94D049BB133111EB)


@triton.jit
def mix64(z):
    # splitmix64's finalizer on uint64, as gpu/sampler.py's _mix64 computes it on int64.
    z = (z ^ (z >> 30)) * MIX_A
    z = (z ^ (z >> 27)) * MIX_B
    return z ^ (z >> 31)


@triton.jit
def gumbel(row_key, offs):
    """The Gumbel noise of tokens `offs` of the row keyed `row_key`: gpu.sampler's, from the same hash."""
    bits = mix64(row_key + (offs + 1).to(tl.uint64) * GOLDEN)
    u = ((bits >> 41) * 2 + 1).to(tl.float32) * (1.0 / (1 << 24))  # as gpu.sampler.uniform_noise
    return -tl.log(-tl.log(u))


@triton.jit
def scaled(base, offs, mask, temperature):
    # IEEE division, as torch divides: the kernel's scaled logits are the torch path's.
    return tl.math.div_rn(tl.load(base + offs, mask=mask, other=float("-inf")), temperature)


@triton.jit
def row_draw(row, temperature_ptr, seed_ptr, position_ptr):
    """The row's temperature (1 for a greedy row), whether it is greedy, and its noise's key."""
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature <= 0
    seed = tl.load(seed_ptr + row).to(tl.uint64, bitcast=True)
    position = tl.load(position_ptr + row).to(tl.uint64, bitcast=True)
    return tl.where(greedy, 1.0, temperature), greedy, mix64(mix64(seed + GOLDEN) + position * GOLDEN)


@triton.jit
def row_filters(row, vocab, top_p_ptr, top_k_ptr, min_p_ptr, head_ptr, bounds_ptr, HAS_HEADS: tl.constexpr):
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
def first_draws(x, mask, greedy, row_key, offs, floor):
    """A block's draws in the first pass: a greedy row's scaled logits, else with their noise, over
    the tokens at or above the row's floor (below it, a token is outside the head)."""
    return tl.where(mask & (x >= floor), tl.where(greedy, x, x + gumbel(row_key, offs)), float("-inf"))


@triton.jit
def still_looking_after_first(greedy, vocab, keep, top_p, log_min_p, floor, outside, top, candidate_x):
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
def above_candidate(x, offs, mask, candidate_x, candidate):
    """The tokens ranked above the candidate, in (scaled logit descending, index ascending) order."""
    return mask & ((x > candidate_x) | ((x == candidate_x) & (offs < candidate)))


@triton.jit
def in_head(above, mass_above, candidate_x, keep, top_p, denominator, top, log_min_p):
    """Whether the candidate, with `above` tokens of `mass_above` ranked above it, is in the head."""
    return (above < keep) & ((top_p >= 1.0) | (mass_above < top_p * denominator)) & (candidate_x >= top + log_min_p)


@triton.jit
def block_softmax(x):
    """A block's largest scaled logit, and its softmax sum relative to it."""
    top = tl.max(x, axis=0)
    return top, tl.sum(tl.exp(x - tl.where(top == float("-inf"), 0.0, top)), axis=0)


@triton.jit
def fold_softmax(top, denominator, block_top, block_sum):
    """The row's top and softmax denominator so far with one more block's folded in."""
    new_top = tl.maximum(top, block_top)
    shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # a row of -inf so far adds nothing
    return new_top, denominator * tl.exp(top - shift) + block_sum * tl.exp(block_top - shift)
