"""The logprobs of `gpu.logprobs.token_logprobs` on the GPU in two kernel launches, where the torch
ops took about fifteen: at one row they were launch-bound (a third of a millisecond behind a
batch-1 decode step), and at 256 rows of 128K logits they read the logits several times over.

1. One program per block of BLOCK logits of a row: the block's max and sum of exponentials (for
   the row's log-sum-exp), and its `top` best tokens as int64 keys that order as (logit, lower id).
   Keys are unique, so the row's best `top` are among its blocks' best `top`: the ranking is exact,
   ties by lower id over the whole row.
2. One program per row: the log-sum-exp from the blocks' sums, the best `top` of the blocks' keys,
   and each entry's logprob (logit - log-sum-exp): the drawn token's, the top ones', the asked ids'.
A row's blocks lie at fixed offsets and fold in one order whatever the number of rows, so its
logprobs are the same bits in any batch, which `--deterministic` relies on.
"""

import torch
import triton
import triton.language as tl

BLOCK = 2048
_MIN_KEY = tl.constexpr(-(2**63))  # below every key


@triton.jit
def _keys(x, offs, vocab):
    """int64 keys that order as (x, -id): the float's bits made to order as floats do, above the
    reversed id. A -0.0 counts as 0.0."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    return ordered * 4294967296 + (vocab - 1 - offs).to(tl.int64)


@triton.jit
def _block_kernel(
    logits_ptr, stride, vocab, maxes_ptr, sums_ptr, keys_ptr, num_blocks, TOP: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    block = tl.program_id(1)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    inside = offs < vocab
    x = tl.load(logits_ptr + row * stride + offs, mask=inside, other=float("-inf"))
    top_logit = tl.max(x, axis=0)
    # A block all -inf adds nothing (and -inf - -inf would be NaN).
    total = tl.sum(tl.exp(x - tl.where(top_logit == float("-inf"), 0.0, top_logit)), axis=0)
    slot = row * num_blocks + block
    tl.store(maxes_ptr + slot, top_logit)
    tl.store(sums_ptr + slot, total)
    if TOP > 0:
        keys = tl.where(inside, _keys(x, offs, vocab), _MIN_KEY)
        for j in tl.static_range(TOP):
            best = tl.max(keys, axis=0)
            tl.store(keys_ptr + slot * TOP + j, best)
            keys = tl.where(keys == best, _MIN_KEY, keys)


@triton.jit
def _row_kernel(
    logits_ptr,
    stride,
    vocab,
    maxes_ptr,
    sums_ptr,
    keys_ptr,
    tokens_ptr,
    asked_ptr,
    out_ptr,
    num_blocks,
    num_asked,
    BLOCKS: tl.constexpr,  # num_blocks rounded up to a power of two
    TOP: tl.constexpr,
    CANDIDATES: tl.constexpr,  # num_blocks * TOP rounded up to a power of two
):
    row = tl.program_id(0)
    b = tl.arange(0, BLOCKS)
    maxes = tl.load(maxes_ptr + row * num_blocks + b, mask=b < num_blocks, other=float("-inf"))
    sums = tl.load(sums_ptr + row * num_blocks + b, mask=b < num_blocks, other=0.0)
    top_logit = tl.max(maxes, axis=0)
    lse = top_logit + tl.log(tl.sum(sums * tl.exp(maxes - top_logit), axis=0))
    base = logits_ptr + row * stride
    width = 1 + 2 * TOP + num_asked
    out = out_ptr + row * width
    token = tl.load(tokens_ptr + row)
    tl.store(out, tl.load(base + token) - lse)
    if TOP > 0:
        c = tl.arange(0, CANDIDATES)
        keys = tl.load(keys_ptr + row * num_blocks * TOP + c, mask=c < num_blocks * TOP, other=_MIN_KEY)
        for j in tl.static_range(TOP):
            best = tl.max(keys, axis=0)
            best_id = vocab - 1 - (best & 0xFFFFFFFF)
            tl.store(out + 1 + j, tl.load(base + best_id) - lse)
            tl.store(out + 1 + TOP + num_asked + j, best_id.to(tl.float32))
            keys = tl.where(keys == best, _MIN_KEY, keys)
    for a in range(num_asked):
        asked = tl.load(asked_ptr + row * num_asked + a)
        tl.store(out + 1 + TOP + a, tl.load(base + asked) - lse)


def token_logprobs_on_gpu(logits: torch.Tensor, tokens: torch.Tensor, top: int, ids: torch.Tensor) -> torch.Tensor:
    """As gpu.logprobs.token_logprobs. logits: [n, V] float32; tokens: [n] int64; ids: [n, A] int64
    -> [n, 1 + top + A + top] float32"""
    n, vocab = logits.shape
    asked = ids.shape[1]
    out = torch.empty(n, 1 + 2 * top + asked, dtype=torch.float32, device=logits.device)
    if n == 0:
        return out
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    num_blocks = triton.cdiv(vocab, BLOCK)
    maxes = torch.empty(n, num_blocks, dtype=torch.float32, device=logits.device)
    sums = torch.empty_like(maxes)
    keys = torch.empty(n, num_blocks, max(top, 1), dtype=torch.int64, device=logits.device)
    _block_kernel[(n, num_blocks)](
        logits, logits.stride(0), vocab, maxes, sums, keys, num_blocks, TOP=top, BLOCK=BLOCK, num_warps=8
    )
    _row_kernel[(n,)](
        logits,
        logits.stride(0),
        vocab,
        maxes,
        sums,
        keys,
        tokens.contiguous(),
        ids.contiguous(),
        out,
        num_blocks,
        asked,
        BLOCKS=triton.next_power_of_2(num_blocks),
        TOP=top,
        CANDIDATES=triton.next_power_of_2(max(num_blocks * top, 1)),
        num_warps=4,
    )
    return out
