"""How often each sequence with a penalty has drawn each token, kept on the device.

The counts must be the device's: with overlapped steps, the token that step N draws reaches the
host only after step N+1 is launched, and step N+1's penalties must count it. So after each draw
the runner adds the drawn tokens to their sequences' rows here, in stream order, with no sync.
Each such sequence owns a row (its penalty slot, handed out by the executor) from its start.
"""

from typing import TYPE_CHECKING, Generic, NamedTuple

import numpy as np
import torch

from gpu.staging import Array

if TYPE_CHECKING:
    from gpu.logit_rules import TokenRules

FIRST_SLOTS = 8  # rows allocated when the first sequence with a penalty comes; doubled as needed


class Penalties(NamedTuple, Generic[Array]):
    """The penalized rows of a step, one entry each."""

    rows: Array  # [P] int64: the row among the step's sampled rows (its logits row)
    slots: Array  # [P] int64: its sequence's penalty slot
    repetition: Array  # [P] float32
    frequency: Array  # [P] float32
    presence: Array  # [P] float32


class SlotStarts(NamedTuple, Generic[Array]):
    """Slots that sequences use for the first time this step: zeroed, then their prompt marked and
    the outputs they generated before a preemption counted."""

    slots: Array  # [I] int64
    prompt_slots: Array  # [Np] int64
    prompt_ids: Array  # [Np] int64
    output_slots: Array  # [No] int64
    output_ids: Array  # [No] int64


class PenaltyCounts:
    """`counts` [slots, V] int32: a slot's generated tokens; `prompt_seen` [slots, V] bool: its prompt's
    (the repetition penalty reads both). Allocated when the first penalized sequence comes.

    A slot is started in the first launch that draws for a sequence holding it: the runner sees a
    `TokenRules` in that slot that is not the one it started it for (each start of a sequence, a
    restart after a preemption included, builds a new one). The executor may hand a freed slot to
    a new sequence at once: the old sequence's last counts were enqueued by launches before the
    new one's first, so in stream order the new start zeroes the slot after them, and nothing of
    the old one is read after it."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.counts: torch.Tensor | None = None
        self.prompt_seen: torch.Tensor | None = None
        self._started_for: dict[int, TokenRules] = {}  # slot -> the TokenRules it was last started for
        self._one = torch.ones((), dtype=torch.int32, device=device)
        self._true = torch.ones((), dtype=torch.bool, device=device)

    def starts(self, penalized: list["TokenRules"]) -> SlotStarts[np.ndarray] | None:
        """The starts, among the slots of the `penalized` rows' rules, of those whose
        sequences draw in them for the first time; None when none does. Grows the tensors to hold
        every slot."""
        new = [r for r in penalized if self._started_for.get(r.penalty_slot) is not r]
        if not new:
            return None
        self._grow(max(r.penalty_slot for r in new) + 1)
        for r in new:
            self._started_for[r.penalty_slot] = r
        slots = np.array([r.penalty_slot for r in new], np.int64)
        prompt_lens = np.array([len(r.penalty_prompt_ids) for r in new], np.int64)
        output_lens = np.array([len(r.penalty_output_ids) for r in new], np.int64)
        return SlotStarts(
            slots=slots,
            prompt_slots=np.repeat(slots, prompt_lens),
            prompt_ids=np.concatenate([r.penalty_prompt_ids for r in new]),
            output_slots=np.repeat(slots, output_lens),
            output_ids=np.concatenate([r.penalty_output_ids for r in new]),
        )

    def start(self, starts: SlotStarts[torch.Tensor]) -> None:
        self.counts.index_fill_(0, starts.slots, 0)
        self.prompt_seen.index_fill_(0, starts.slots, False)
        self.prompt_seen.index_put_((starts.prompt_slots, starts.prompt_ids), self._true)
        self.counts.index_put_((starts.output_slots, starts.output_ids), self._one, accumulate=True)

    def penalize(self, logits: torch.Tensor, p: Penalties[torch.Tensor]) -> None:
        """Edits `logits` [R, V] float32 in place, as vLLM does: the repetition penalty divides a
        positive logit (multiplies another) of every token in the prompt or generated, then the
        frequency penalty is subtracted per generated occurrence and the presence penalty once."""
        counts = self.counts.index_select(0, p.slots)  # [P, V] int32
        generated = counts > 0  # [P, V]
        seen = generated | self.prompt_seen.index_select(0, p.slots)  # [P, V]
        rows = logits.index_select(0, p.rows)  # [P, V]
        repetition = torch.where(seen, p.repetition[:, None], 1.0)  # [P, V]
        rows = torch.where(rows > 0, rows / repetition, rows * repetition)
        rows -= p.frequency[:, None] * counts + p.presence[:, None] * generated
        logits.index_copy_(0, p.rows, rows)

    def count(self, p: Penalties[torch.Tensor], drawn: torch.Tensor) -> None:
        """Adds the tokens `drawn` [R] int64 of the penalized rows to their slots."""
        self.counts.index_put_((p.slots, drawn.index_select(0, p.rows)), self._one, accumulate=True)

    def _grow(self, slots: int) -> None:
        capacity = 0 if self.counts is None else len(self.counts)
        if slots <= capacity:
            return
        new_capacity = max(capacity, FIRST_SLOTS)
        while new_capacity < slots:
            new_capacity *= 2
        counts = torch.zeros(new_capacity, self.vocab_size, dtype=torch.int32, device=self.device)
        prompt_seen = torch.zeros(new_capacity, self.vocab_size, dtype=torch.bool, device=self.device)
        if capacity:
            counts[:capacity] = self.counts
            prompt_seen[:capacity] = self.prompt_seen
        self.counts, self.prompt_seen = counts, prompt_seen
