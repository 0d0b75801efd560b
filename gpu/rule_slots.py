"""Each ruled sequence's state on the device, in its slot (a row of each tensor): its generated
token counts and prompt marks (the penalties'), and its blocked tokens (the allowed and disallowed
ids, as one mask).

The counts must be the device's: with overlapped steps, the token that step N draws reaches the
host only after step N+1 is launched, and step N+1's penalties must count it. So after each draw
the runner adds the drawn tokens to their rows here, in stream order, with no sync. The masks are
laid out once, when the sequence starts, so a step uploads none of a mask's ids.
"""

from typing import TYPE_CHECKING, Generic, NamedTuple

import numpy as np
import torch

from gpu.staging import Array

if TYPE_CHECKING:
    from gpu.logit_rules import TokenRules

FIRST_SLOTS = 8  # rows allocated when the first sequence with rules comes; doubled as needed
_NONE = np.zeros(0, np.int64)


class SlotStarts(NamedTuple, Generic[Array]):
    """Slots that sequences use for the first time in a step: they are cleared, then each
    sequence's prompt marked, the outputs it drew before a preemption counted, and its mask laid
    out. (slot, token) pairs are flat indices into the [slots, V] tensors (slot * V + token)."""

    slots: Array  # [I] int64
    masked_slots: Array  # [M] int64: those with an allowed set, blocked whole before it is opened
    prompt_at: Array  # [Np] int64
    output_at: Array  # [No] int64, each once
    output_counts: Array  # [No] int32: how often each was drawn
    allowed_at: Array  # [Na] int64
    disallowed_at: Array  # [Nd] int64


def flat_indices(rows, parts: list[np.ndarray], width: int) -> np.ndarray:
    """[N] int64: the ids of each part in its row (of `rows`, [len(parts)]) of a [*, width] tensor,
    as indices into the tensor flattened."""
    if not parts:
        return _NONE
    lengths = np.fromiter(map(len, parts), np.int64, len(parts))
    return np.repeat(np.asarray(rows, np.int64) * width, lengths) + np.concatenate(parts)


class RuleSlots:
    """`counts` [slots, V] int32: a slot's generated tokens; `prompt_seen` [slots, V] bool: its
    prompt's (the repetition penalty reads both); `blocked` [slots, V] bool: the tokens it may not
    draw. Allocated when the first sequence with rules comes, grown by doubling.

    A slot is started in the first launch that draws for a sequence holding it: the runner sees in
    it a `TokenRules` that is not the one it started it for (each start of a sequence, a restart
    after a preemption included, builds a new one). The executor may hand a freed slot to a new
    sequence at once: the old sequence's last counts were enqueued by launches before the new
    one's first, so in stream order the new start clears the slot after them, and nothing of the
    old one is read after it."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.counts: torch.Tensor | None = None
        self.prompt_seen: torch.Tensor | None = None
        self.blocked: torch.Tensor | None = None
        self._started_for: dict[int, TokenRules] = {}  # slot -> the rules it was last started for
        self._ones = torch.ones(0, dtype=torch.int32, device=device)  # [slots]: what a count adds

    def starts(self, rules: list["TokenRules"]) -> SlotStarts[np.ndarray] | None:
        """The starts of the slots of `rules` whose sequences draw in them for the first time; None
        when none does. Grows the tensors to hold every slot."""
        new = [r for r in rules if self._started_for.get(r.slot) is not r]
        if not new:
            return None
        if min(r.slot for r in new) < 0:
            raise ValueError("rules with penalties or a mask need a slot (TokenRules.with_slot)")
        self._grow(max(r.slot for r in new) + 1)
        for r in new:
            self._started_for[r.slot] = r
        slots = np.array([r.slot for r in new], np.int64)
        with_allowed = [r for r in new if r.allowed_ids is not None]
        masked_slots = np.array([r.slot for r in with_allowed], np.int64)
        output_at, output_counts = np.unique(
            flat_indices(slots, [r.penalty_output_ids for r in new], self.vocab_size), return_counts=True
        )
        return SlotStarts(
            slots=slots,
            masked_slots=masked_slots,
            prompt_at=flat_indices(slots, [r.penalty_prompt_ids for r in new], self.vocab_size),
            output_at=output_at,
            output_counts=output_counts.astype(np.int32),
            allowed_at=flat_indices(masked_slots, [r.allowed_ids for r in with_allowed], self.vocab_size),
            disallowed_at=flat_indices(slots, [r.disallowed_ids for r in new], self.vocab_size),
        )

    def start(self, s: SlotStarts[torch.Tensor]) -> None:
        """Lays the uploaded starts out in their slots, in stream order."""
        self.counts.index_fill_(0, s.slots, 0)
        self.prompt_seen.index_fill_(0, s.slots, False)
        self.blocked.index_fill_(0, s.slots, False)
        self.blocked.index_fill_(0, s.masked_slots, True)
        blocked, prompt_seen = self.blocked.view(-1), self.prompt_seen.view(-1)
        blocked.index_fill_(0, s.allowed_at, False)
        blocked.index_fill_(0, s.disallowed_at, True)
        prompt_seen.index_fill_(0, s.prompt_at, True)
        self.counts.view(-1).index_add_(0, s.output_at, s.output_counts)

    def count(self, at: torch.Tensor, rows: torch.Tensor, drawn: torch.Tensor) -> None:
        """Adds the tokens `drawn` [R] int64 of `rows` [P] to their slots, which start at `at` [P]
        in the flat counts: one index_add_, where a 2-D index_put_ costs many times the host time."""
        self.counts.view(-1).index_add_(0, at + drawn.index_select(0, rows), self._ones[: len(at)])

    def _grow(self, slots: int) -> None:
        capacity = 0 if self.counts is None else len(self.counts)
        if slots <= capacity:
            return
        new_capacity = max(capacity, FIRST_SLOTS)
        while new_capacity < slots:
            new_capacity *= 2
        grown = []
        for old, dtype in ((self.counts, torch.int32), (self.prompt_seen, torch.bool), (self.blocked, torch.bool)):
            new = torch.zeros(new_capacity, self.vocab_size, dtype=dtype, device=self.device)
            if capacity:
                new[:capacity] = old
            grown.append(new)
        self.counts, self.prompt_seen, self.blocked = grown
        self._ones = torch.ones(new_capacity, dtype=torch.int32, device=self.device)
