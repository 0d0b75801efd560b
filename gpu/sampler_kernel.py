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
  one program per row combines their results (gpu/sampler_split.py), and the one-program loop
  finishes what rows are still looking after that.
  Both ways reduce the same blocks with the same code, then fold the blocks' sums in the same
  order, so a row draws the same token whichever way its batch went, even where top-p's boundary
  falls within rounding.
"""

import torch
import triton
import triton.language as tl

from gpu.sampler import SamplingTensors
from gpu.sampler_heads import heads
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
from gpu.sampler_split import split_passes

# Batches of at most SPLIT_ROWS rows split each row's first pass (and some rejection passes) over a
# program per BLOCK of the row (gpu/sampler_split.py).
SPLIT_ROWS = 16


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
    temperature, greedy, row_key = row_draw(row, temperature_ptr, seed_ptr, position_ptr)
    keep, top_p, log_min_p, floor, outside = row_filters(
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
            x = scaled(base, offs, mask, temperature)
            block_top, block_sum = block_softmax(x)
            top, denominator = fold_softmax(top, denominator, block_top, block_sum)
            y = first_draws(x, mask, greedy, row_key, offs, floor)
            block_best = tl.max(y, axis=0)
            candidate = tl.where(block_best > best, start + tl.argmax(y, axis=0), candidate)
            best = tl.maximum(best, block_best)
        candidate_x = tl.math.div_rn(tl.load(base + candidate), temperature)
        looking = still_looking_after_first(greedy, vocab, keep, top_p, log_min_p, floor, outside, top, candidate_x)

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
            x = scaled(base, offs, mask, temperature)
            ranks_above = above_candidate(x, offs, mask, candidate_x, candidate)
            block_above = tl.sum(ranks_above.to(tl.int32), axis=0)
            if block_above > 0:  # after a rejection or two most blocks have none: skip their noise
                above += block_above
                mass_above += tl.sum(tl.where(ranks_above, tl.exp(x - top), 0.0), axis=0)
                y = tl.where(ranks_above, x + gumbel(row_key, offs), float("-inf"))
                block_best = tl.max(y, axis=0)
                next_candidate = tl.where(block_best > best, start + tl.argmax(y, axis=0), next_candidate)
                best = tl.maximum(best, block_best)
        kept = in_head(above, mass_above, candidate_x, keep, top_p, denominator, top, log_min_p)
        looking = ~(kept | (above == 0))
        candidate = tl.where(looking, next_candidate, candidate)
    tl.store(out_ptr + row, candidate.to(tl.int64))


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
        state_f, state_i = split_passes(row_args, params.any_rejections, has_heads)
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
