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


@triton.jit(do_not_specialize=["largest_k"])
def _head_kernel(
    values_ptr, largest_k, temperature_ptr, top_p_ptr, top_k_ptr, head_ptr, floor_ptr, CHUNK: tl.constexpr,
):
    """The head of each sampled row with both a top-k and a top-p: how many tokens it keeps (top-k,
    then top-p over the top-k head's renormalized probabilities, as gpu.sampler.filter_top_k_top_p
    keeps them) and the scaled logit of the last of them; 0 and -inf for the other rows.
    values: [S, largest_k] float32, each row's best logits in descending order."""
    row = tl.program_id(0)
    base = values_ptr + row.to(tl.int64) * largest_k
    temperature = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    headed = (temperature > 0) & (top_k > 0) & (top_p < 1.0)
    temperature = tl.where(temperature > 0, temperature, 1.0)
    k = tl.minimum(top_k, largest_k)
    top = tl.math.div_rn(tl.load(base), temperature)
    shift = tl.where(top == float("-inf"), 0.0, top)  # a row of -inf keeps its best token alone
    head_mass = 0.0
    for start in range(0, largest_k, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        x = tl.math.div_rn(tl.load(base + offs, mask=offs < k, other=float("-inf")), temperature)
        head_mass += tl.sum(tl.exp(x - shift), axis=0)
    # The head is a prefix: the mass of the tokens ranked above a token only grows down the row.
    kept = 0
    mass = 0.0
    for start in range(0, largest_k, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        x = tl.math.div_rn(tl.load(base + offs, mask=offs < k, other=float("-inf")), temperature)
        p = tl.exp(x - shift)
        mass_before = mass + tl.cumsum(p, axis=0) - p
        kept += tl.sum(((offs < k) & (mass_before < top_p * head_mass)).to(tl.int32), axis=0)
        mass += tl.sum(p, axis=0)
    head = tl.maximum(kept, 1)  # the best token always stays
    floor = tl.math.div_rn(tl.load(base + tl.maximum(head - 1, 0)), temperature)
    tl.store(head_ptr + row, tl.where(headed, head, 0).to(tl.int64))
    tl.store(floor_ptr + row, tl.where(headed, floor, float("-inf")))


def heads(logits: torch.Tensor, params: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """[S] int64, [S] float32: the head of each sampled row with both top-k and top-p (see
    _head_kernel), from the rows' best logits, with no host sync. logits: [S, V] float32"""
    rows = logits.shape[0]
    largest_k = min(params.largest_joint_top_k, logits.shape[-1])
    # A positive temperature keeps the order, so the best logits are the best scaled logits.
    values = logits.topk(largest_k, dim=-1).values  # [S, K], descending
    sizes = torch.empty(rows, dtype=torch.int64, device=logits.device)
    floors = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _head_kernel[(rows,)](values, largest_k, params.temperature, params.top_p, params.top_k, sizes, floors,
                          CHUNK=CHUNK_TOKENS)
    return sizes, floors
