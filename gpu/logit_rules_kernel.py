"""The per-slot rules of a step in one pass over its logits on the GPU: the penalties, then the
blocked tokens, of each row with a slot (gpu/logit_rules.py's torch path, fused). A row is read
once, with its slot's counts, prompt marks and mask, and written once; a row without a slot is
copied. The sparse edits (bias, min_tokens' bans) follow as index ops."""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from gpu.logit_rules import SlotRows
    from gpu.rule_slots import RuleSlots

BLOCK = 2048  # tokens a program edits


@triton.jit
def _rules_kernel(
    logits_ptr,
    stride,
    out_ptr,
    vocab,
    slot_ptr,
    repetition_ptr,
    frequency_ptr,
    presence_ptr,
    counts_ptr,
    seen_ptr,
    blocked_ptr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=mask)
    slot = tl.load(slot_ptr + row)
    if slot >= 0:
        base = slot * vocab
        counts = tl.load(counts_ptr + base + offs, mask=mask, other=0)
        generated = counts > 0
        seen = generated | (tl.load(seen_ptr + base + offs, mask=mask, other=0) != 0)
        penalty = tl.where(seen, tl.load(repetition_ptr + row), 1.0)
        # IEEE division, as torch divides.
        x = tl.where(x > 0, tl.math.div_rn(x, penalty), x * penalty)
        x = x - (
            tl.load(frequency_ptr + row) * counts.to(tl.float32)
            + tl.load(presence_ptr + row) * generated.to(tl.float32)
        )
        blocked = tl.load(blocked_ptr + base + offs, mask=mask, other=0) != 0
        x = tl.where(blocked, float("-inf"), x)
    tl.store(out_ptr + row.to(tl.int64) * vocab + offs, x, mask=mask)


def slot_rules_on_gpu(logits: torch.Tensor, rows: "SlotRows[torch.Tensor]", slots: "RuleSlots") -> torch.Tensor:
    """[R, V] float32, a new tensor: `logits` [R, V] (rows may be strided apart) with the penalties and
    the mask of each row with a slot applied, as gpu.logit_rules.slot_rules_torch applies them."""
    return _launch(
        logits,
        rows.slots,
        rows.repetition,
        rows.frequency,
        rows.presence,
        slots.counts,
        slots.prompt_seen,
        slots.blocked,
    )


def compile_slot_rules(vocab_size: int, device: torch.device) -> None:
    """Compiles the kernel for this vocabulary now: compiled on a first ruled step instead, it
    would hold up that step by seconds."""
    no_slot = torch.full((1,), -1, dtype=torch.int64, device=device)
    ones = torch.ones(1, device=device)
    state = torch.zeros(1, vocab_size, dtype=torch.int32, device=device)
    mask = torch.zeros(1, vocab_size, dtype=torch.bool, device=device)
    _launch(torch.zeros(1, vocab_size, device=device), no_slot, ones, ones, ones, state, mask, mask)


def _launch(logits, slots, repetition, frequency, presence, counts, prompt_seen, blocked) -> torch.Tensor:
    # logits [R, V] float32; slots [R] int64 (-1: none); repetition, frequency, presence [R] float32;
    # counts [S, V] int32; prompt_seen, blocked [S, V] bool
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    out = torch.empty(rows, vocab, dtype=logits.dtype, device=logits.device)
    if rows:
        _rules_kernel[(rows, triton.cdiv(vocab, BLOCK))](
            logits,
            logits.stride(0),
            out,
            vocab,
            slots,
            repetition,
            frequency,
            presence,
            counts,
            prompt_seen.view(torch.uint8),
            blocked.view(torch.uint8),
            BLOCK=BLOCK,
        )
    return out
