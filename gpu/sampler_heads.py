"""The head that top-k, then top-p over the top-k head's renormalized probabilities, keep of each
row with both (vLLM's order, as gpu.sampler.filter_top_k_top_p): gpu/sampler_kernel.py draws
those rows from it at once, where its rejection passes would walk down the row to find it.
Worked out from the rows' best logits, with no host sync.
"""

import torch
import triton
import triton.language as tl

from gpu.sampler import SamplingTensors

CHUNK_TOKENS = 128  # of a row's best logits, read at a time


@triton.jit(do_not_specialize=["width"])
def _head_kernel(
    values_ptr,
    width,
    temperature_ptr,
    top_p_ptr,
    top_k_ptr,
    head_ptr,
    bounds_ptr,
    CHUNK: tl.constexpr,
):
    """The head of each sampled row with both a top-k and a top-p: how many tokens it keeps (top-k,
    then top-p over the top-k head's renormalized probabilities, as gpu.sampler.filter_top_k_top_p
    keeps them), the scaled logit of the last of them (the floor) and the best scaled logit outside
    it (-inf if none); 0, -inf and -inf for the other rows.
    values: [S, width] float32, each row's best logits in descending order, one more than the
    largest such top-k where the vocabulary has it. bounds: [S, 2] float32, floor then outside."""
    row = tl.program_id(0)
    base = values_ptr + row.to(tl.int64) * width
    temperature = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    headed = (temperature > 0) & (top_k > 0) & (top_p < 1.0)
    temperature = tl.where(temperature > 0, temperature, 1.0)
    k = tl.minimum(top_k, width)
    top = tl.math.div_rn(tl.load(base), temperature)
    shift = tl.where(top == float("-inf"), 0.0, top)  # a row of -inf keeps its best token alone
    head_mass = 0.0
    for start in range(0, width, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        x = tl.math.div_rn(tl.load(base + offs, mask=offs < k, other=float("-inf")), temperature)
        head_mass += tl.sum(tl.exp(x - shift), axis=0)
    # The head is a prefix: the mass of the tokens ranked above a token only grows down the row.
    kept = 0
    mass = 0.0
    for start in range(0, width, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        x = tl.math.div_rn(tl.load(base + offs, mask=offs < k, other=float("-inf")), temperature)
        p = tl.exp(x - shift)
        mass_before = mass + tl.cumsum(p, axis=0) - p
        kept += tl.sum(((offs < k) & (mass_before < top_p * head_mass)).to(tl.int32), axis=0)
        mass += tl.sum(p, axis=0)
    head = tl.maximum(kept, 1)  # the best token always stays
    floor = tl.math.div_rn(tl.load(base + head - 1), temperature)
    # Where it equals the floor, tokens on the floor tie across the head's end, and only their rank
    # tells whether they are in the head.
    outside = tl.math.div_rn(tl.load(base + tl.minimum(head, width - 1)), temperature)
    outside = tl.where(head < width, outside, float("-inf"))
    tl.store(head_ptr + row, tl.where(headed, head, 0).to(tl.int64))
    tl.store(bounds_ptr + 2 * row, tl.where(headed, floor, float("-inf")))
    tl.store(bounds_ptr + 2 * row + 1, tl.where(headed, outside, float("-inf")))


def heads(logits: torch.Tensor, params: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """[S] int64, [S, 2] float32: the head of each sampled row with both top-k and top-p, its floor
    and the best logit outside it (see _head_kernel), from the rows' best logits, with no host sync.
    logits: [S, V] float32"""
    rows = logits.shape[0]
    width = min(params.largest_joint_top_k + 1, logits.shape[-1])
    # A positive temperature keeps the order, so the best logits are the best scaled logits.
    values = logits.topk(width, dim=-1).values  # [S, width], descending
    sizes = torch.empty(rows, dtype=torch.int64, device=logits.device)
    bounds = torch.empty(rows, 2, dtype=torch.float32, device=logits.device)
    _head_kernel[(rows,)](
        values, width, params.temperature, params.top_p, params.top_k, sizes, bounds, CHUNK=CHUNK_TOKENS
    )
    return sizes, bounds
