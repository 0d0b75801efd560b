"""Per-request controls of the draw, applied to the logits of the whole step on the device:
penalties, logit bias, allowed and disallowed tokens, and min_tokens (the end tokens banned until
that many outputs).

The executor builds a sequence's `TokenRules` once, when it starts, and gives it a slot when it
has penalties or a mask: its state on the device (gpu/rule_slots.py), laid out in its first step.
Each step the runner's `LogitRules` uploads the sampled rows' settings in one copy and edits the
logits in one pass (penalties and masks of slotted rows; gpu/logit_rules_kernel.py on CUDA) and
two index ops (bias, min_tokens' bans). A rule reads only its own sequence (its generated tokens,
its output index), so the draw stays a pure function of the seed, the output position and the
token, whatever shares the batch.
"""

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple

import numpy as np
import torch

from gpu.logit_rules_kernel import compile_slot_rules, slot_rules_on_gpu
from gpu.rule_slots import RuleSlots, flat_indices
from gpu.staging import Array, Staging, on_cpu
from gpu.step_io import SequenceInput

_NONE = np.zeros(0, np.int64)


def _ids(ids: Iterable[int]) -> np.ndarray:
    """[N] int64, sorted, each once (by sorting: numpy's hashing np.unique costs ten times more)."""
    ids = np.sort(np.fromiter(ids, np.int64))
    return ids[np.concatenate(([True], ids[1:] != ids[:-1]))] if ids.size else ids


def _minus(ids: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """`ids` without `removed` (both as `_ids` gives them)."""
    return ids[~np.isin(ids, removed, assume_unique=True)] if removed.size else ids


@dataclass(frozen=True, eq=False)  # compared by identity: the runner tells a sequence's starts apart by it
class TokenRules:
    """One sequence's controls for one run, fixed from its start."""

    bias_ids: np.ndarray  # [B] int64, each once
    bias_values: np.ndarray  # [B] float32: added to those tokens' logits
    allowed_ids: np.ndarray | None  # [A] int64: only these may be drawn; None: any
    disallowed_ids: np.ndarray  # [D] int64: never drawn
    min_tokens: int
    end_bans: np.ndarray  # [E] int64: the end tokens banned while fewer than min_tokens were drawn
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    penalty_prompt_ids: np.ndarray  # [Np] int64: the prompt, for the repetition penalty
    penalty_output_ids: np.ndarray  # [No] int64: the outputs drawn before this run (after a preemption)
    penalized: bool  # a penalty is set: the draws are counted
    # Penalties count its tokens, and a mask is laid out, in a slot of the runner's state.
    needs_slot: bool
    slot: int = -1  # that slot, once given (`with_slot`)

    def with_slot(self, slot: int) -> "TokenRules":
        return dataclasses.replace(self, slot=slot)

    @classmethod
    def build(
        cls,
        vocab_size: int,
        end_ids: Iterable[int] = (),
        min_tokens: int = 0,
        logit_bias: Mapping[int, float] | None = None,
        allowed_ids: Iterable[int] | None = None,
        disallowed_ids: Iterable[int] = (),
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        penalty_prompt_ids: Sequence[int] = (),
        penalty_output_ids: Sequence[int] = (),
    ) -> "TokenRules | None":
        """The rules of a sequence, without a slot yet, or None when it asks for none. `end_ids`:
        what min_tokens bans (EOS and the stop token ids, or only the latter with ignore_eos).
        Raises ValueError on a token id outside the vocabulary, or masks that leave no token to
        draw (the scheduler refuses such requests first)."""
        logit_bias = logit_bias or {}
        bias_ids = np.fromiter(logit_bias.keys(), np.int64, len(logit_bias))
        allowed = None if allowed_ids is None else _ids(allowed_ids)
        disallowed = _ids(disallowed_ids)
        for ids in (bias_ids, disallowed, _NONE if allowed is None else allowed):
            if ids.size and not (0 <= ids.min() and ids.max() < vocab_size):
                raise ValueError(f"token ids must be in 0..{vocab_size - 1}")
        drawable = vocab_size - disallowed.size if allowed is None else _minus(allowed, disallowed).size
        if drawable == 0:
            raise ValueError("the allowed and disallowed token ids leave no token to draw")
        # Stop token ids are not checked against the vocabulary: one outside it is never drawn.
        ends = _ids(i for i in end_ids if 0 <= i < vocab_size) if min_tokens > 0 else _NONE
        if allowed is None:
            others = vocab_size - disallowed.size - _minus(ends, disallowed).size
        else:
            others = _minus(_minus(allowed, disallowed), ends).size
        # The allowed and disallowed ids win over min_tokens: where only end tokens are left to draw,
        # min_tokens bans nothing, so a row always keeps a token to draw (it is never all -inf).
        end_bans = ends if others else _NONE
        penalized = repetition_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0
        if not (bias_ids.size or allowed is not None or disallowed.size or end_bans.size or penalized):
            return None
        return cls(
            bias_ids=bias_ids,
            bias_values=np.fromiter(logit_bias.values(), np.float32, len(logit_bias)),
            allowed_ids=allowed,
            disallowed_ids=disallowed,
            min_tokens=min_tokens if end_bans.size else 0,
            end_bans=end_bans,
            repetition_penalty=repetition_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            penalty_prompt_ids=np.asarray(penalty_prompt_ids if repetition_penalty != 1.0 else (), np.int64),
            penalty_output_ids=np.asarray(penalty_output_ids if penalized else (), np.int64),
            penalized=penalized,
            needs_slot=penalized or allowed is not None or bool(disallowed.size),
        )


class SlotRows(NamedTuple, Generic[Array]):
    """The step's rows' slots and penalties, one entry per sampled row."""

    slots: Array  # [R] int64; -1 for a row without a slot
    repetition: Array  # [R] float32; 1 for a row without penalties
    frequency: Array  # [R] float32
    presence: Array  # [R] float32
    slotted_rows: Array  # [Q] int64: the rows with a slot
    counted_rows: Array  # [P] int64: the rows whose draws their penalties count
    counted_at: Array  # [P] int64: where those rows' slots start in the flat counts (slot * V)


class Edits(NamedTuple, Generic[Array]):
    """What a step adds to and bans in its rows' logits [R, V], at flat indices (row * V + token):
    one index op each, where a 2-D index_put_ costs many times the host time."""

    biased: Array  # [B] int64
    bias_values: Array  # [B] float32
    banned: Array  # [N] int64: the end tokens under min_tokens


@dataclass(frozen=True)
class StepRules:
    """A step's rules on the device, and which of their ops it needs (known on the host)."""

    rows: SlotRows[torch.Tensor]
    edits: Edits[torch.Tensor]
    any_slotted: bool
    any_counted: bool
    any_bias: bool
    any_banned: bool


class LogitRules:
    """The runner's side: the slots' state, and the step's edits of the logits before the draw."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.slots = RuleSlots(vocab_size, device)
        # Its own pinned buffer, so the rules travel in one copy without reshaping the step's own.
        self._staging = Staging(device, 64 << 10) if device.type == "cuda" else None
        # The same edits either way (but for float rounding); the kernel makes one pass of the rows.
        self._slot_rules = slot_rules_on_gpu if device.type == "cuda" else slot_rules_torch
        if device.type == "cuda":
            compile_slot_rules(vocab_size, device)  # now, not in a first ruled step

    def prepare(self, chosen: Sequence[SequenceInput]) -> StepRules | None:
        """The rules of the sampled rows `chosen`, uploaded, and the slots first used here started;
        None when no row has rules (the step does nothing more)."""
        # One pass over the rows, gathering lists; numpy arrays from them after.
        slotted, settings, counted, counted_slots = [], [], [], []
        biased, bias_ids, bias_values, banned, banned_ids = [], [], [], [], []
        any_rules = False
        for row, seq in enumerate(chosen):
            r = seq.rules
            if r is None:
                continue
            any_rules = True
            if r.needs_slot:
                slotted.append(r)
                settings.append((row, r.slot, r.repetition_penalty, r.frequency_penalty, r.presence_penalty))
                if r.penalized:
                    counted.append(row)
                    counted_slots.append(r.slot)
            if r.bias_ids.size:
                biased.append(row)
                bias_ids.append(r.bias_ids)
                bias_values.append(r.bias_values)
            if seq.output_index < r.min_tokens:
                banned.append(row)
                banned_ids.append(r.end_bans)
        if not any_rules:
            return None
        n = len(chosen)
        slot_rows = SlotRows(
            slots=np.full(n, -1, np.int64),
            repetition=np.ones(n, np.float32),
            frequency=np.zeros(n, np.float32),
            presence=np.zeros(n, np.float32),
            slotted_rows=_NONE,
            counted_rows=np.array(counted, np.int64),
            counted_at=np.array(counted_slots, np.int64) * self.vocab_size,
        )
        if settings:
            table = np.array(settings)  # [Q, 5] float64: row, slot, then the three penalties
            rows = table[:, 0].astype(np.int64)
            slot_rows = slot_rows._replace(slotted_rows=rows)
            slot_rows.slots[rows] = table[:, 1]
            slot_rows.repetition[rows] = table[:, 2]
            slot_rows.frequency[rows] = table[:, 3]
            slot_rows.presence[rows] = table[:, 4]
        edits = Edits(
            biased=flat_indices(biased, bias_ids, self.vocab_size),
            bias_values=np.concatenate(bias_values) if biased else np.zeros(0, np.float32),
            banned=flat_indices(banned, banned_ids, self.vocab_size),
        )
        starts = self.slots.starts(slotted)
        slot_rows, edits, starts = self._upload(slot_rows, edits, starts)
        if starts is not None:
            self.slots.start(starts)
        return StepRules(
            rows=slot_rows,
            edits=edits,
            any_slotted=bool(slotted),
            any_counted=bool(counted),
            any_bias=bool(biased),
            any_banned=bool(banned),
        )

    def apply(self, step: StepRules | None, logits: torch.Tensor) -> torch.Tensor:
        """The logits [R, V] float32 after the step's rules: penalties, bias, then the allowed and
        disallowed masks and min_tokens' bans (-inf). A new tensor when a row has rules: `logits`
        stays as it was (the raw logprobs read it); `logits` itself otherwise."""
        if step is None:
            return logits
        if step.any_slotted:
            out = self._slot_rules(logits, step.rows, self.slots)
        else:
            out = logits.clone(memory_format=torch.contiguous_format)
        # The bias comes after the masks here, with the same result: a masked logit stays -inf.
        e, flat = step.edits, out.view(-1)  # [R * V]
        if step.any_bias:  # each (row, token) once: the sum is the same in any order
            flat.index_add_(0, e.biased, e.bias_values)
        if step.any_banned:
            flat.index_fill_(0, e.banned, float("-inf"))
        return out

    def count(self, step: StepRules | None, drawn: torch.Tensor) -> None:
        """After the draw: the drawn tokens [R] int64 of penalized rows join their slots' counts."""
        if step is not None and step.any_counted:
            self.slots.count(step.rows.counted_at, step.rows.counted_rows, drawn)

    def _upload(self, *bundles):
        if self._staging is None:
            return tuple(map(on_cpu, bundles))
        uploaded = self._staging.upload(*bundles)
        self._staging.release()  # nothing else reads the pinned copy
        return uploaded


def slot_rules_torch(logits: torch.Tensor, rows: SlotRows[torch.Tensor], slots: RuleSlots) -> torch.Tensor:
    """[R, V] float32, a new tensor: `logits` [R, V] with the penalties and the mask of each row
    with a slot applied, in torch ops (gpu/logit_rules_kernel.py fuses them). The penalties as vLLM
    applies them: the repetition penalty divides a positive logit (multiplies another) of every
    token in the prompt or generated, then the frequency penalty is subtracted per generated
    occurrence and the presence penalty once; then the blocked tokens are -inf."""
    out = logits.clone(memory_format=torch.contiguous_format)
    q = rows.slotted_rows  # [Q]
    own = rows.slots.index_select(0, q)  # [Q]
    counts = slots.counts.index_select(0, own)  # [Q, V] int32
    generated = counts > 0
    seen = generated | slots.prompt_seen.index_select(0, own)
    x = logits.index_select(0, q)  # [Q, V]
    penalty = torch.where(seen, rows.repetition.index_select(0, q)[:, None], 1.0)
    x = torch.where(x > 0, x / penalty, x * penalty)
    x = x - (
        rows.frequency.index_select(0, q)[:, None] * counts + rows.presence.index_select(0, q)[:, None] * generated
    )
    out.index_copy_(0, q, x.masked_fill(slots.blocked.index_select(0, own), float("-inf")))
    return out
