"""Per-request controls of the draw, applied to the logits of the whole step on the device:
penalties, logit bias, allowed and disallowed tokens, and min_tokens (the end tokens banned until
that many outputs).

The executor builds a sequence's `TokenRules` once, when it starts; each step the runner's
`LogitRules` lays the sampled rows' rules out as flat host arrays, uploads them in one copy and
edits the logits with a few batched ops before the sampler. A rule reads only its own sequence
(its generated tokens, its output index), so the draw stays a pure function of the seed, the output
position and the token, whatever shares the batch.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple

import numpy as np
import torch

from gpu.penalty_counts import Penalties, PenaltyCounts
from gpu.staging import Array, Staging, on_cpu
from gpu.step_io import SequenceInput

_NONE = np.zeros(0, np.int64)


def _ids(ids: Iterable[int]) -> np.ndarray:
    return np.unique(np.fromiter(ids, np.int64))


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
    penalty_slot: int  # its row in the runner's penalty counts; -1 without a penalty
    penalty_prompt_ids: np.ndarray  # [Np] int64: the prompt, for the repetition penalty
    penalty_output_ids: np.ndarray  # [No] int64: the outputs drawn before this run (after a preemption)

    @staticmethod
    def penalized(repetition_penalty: float, frequency_penalty: float, presence_penalty: float) -> bool:
        """Whether these penalties change anything: then the sequence needs a penalty slot."""
        return repetition_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0

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
        penalty_slot: int = -1,
        penalty_prompt_ids: Sequence[int] = (),
        penalty_output_ids: Sequence[int] = (),
    ) -> "TokenRules | None":
        """The rules of a sequence, or None when it asks for none. `end_ids`: what min_tokens bans
        (EOS and the stop token ids, or only the latter with ignore_eos). Raises ValueError on a
        token id outside the vocabulary, a penalty without a slot, or rules that leave no token to
        draw (the scheduler refuses such requests first)."""
        logit_bias = logit_bias or {}
        bias_ids = np.fromiter(logit_bias.keys(), np.int64, len(logit_bias))
        allowed = None if allowed_ids is None else _ids(allowed_ids)
        disallowed = _ids(disallowed_ids)
        for ids in (bias_ids, disallowed, _NONE if allowed is None else allowed):
            if ids.size and not (0 <= ids.min() and ids.max() < vocab_size):
                raise ValueError(f"token ids must be in 0..{vocab_size - 1}")
        penalized = cls.penalized(repetition_penalty, frequency_penalty, presence_penalty)
        if penalized and penalty_slot < 0:
            raise ValueError("a penalty needs a penalty slot")
        drawable = vocab_size - disallowed.size if allowed is None else np.setdiff1d(allowed, disallowed).size
        if drawable == 0:
            raise ValueError("the allowed and disallowed token ids leave no token to draw")
        # Stop token ids are not checked against the vocabulary: one outside it is never drawn.
        ends = _ids(i for i in end_ids if 0 <= i < vocab_size) if min_tokens > 0 else _NONE
        if allowed is None:
            others = vocab_size - np.union1d(disallowed, ends).size
        else:
            others = np.setdiff1d(np.setdiff1d(allowed, disallowed), ends).size
        # The allowed and disallowed ids win over min_tokens: where only end tokens are left to draw,
        # min_tokens bans nothing, so a row always keeps a token to draw (it is never all -inf).
        end_bans = ends if others else _NONE
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
            penalty_slot=penalty_slot if penalized else -1,
            penalty_prompt_ids=np.asarray(penalty_prompt_ids if repetition_penalty != 1.0 else (), np.int64),
            penalty_output_ids=np.asarray(penalty_output_ids if penalized else (), np.int64),
        )

    def bans(self, output_index: int) -> np.ndarray:
        """[N] int64: the tokens this sequence may not draw as output `output_index`."""
        if output_index < self.min_tokens:
            return np.concatenate([self.disallowed_ids, self.end_bans])
        return self.disallowed_ids


class Edits(NamedTuple, Generic[Array]):
    """What a step adds to and masks in its rows' logits, flat over (row, token) pairs."""

    bias_rows: Array  # [B] int64
    bias_ids: Array  # [B] int64
    bias_values: Array  # [B] float32
    allowed_rows: Array  # [A] int64: the rows with an allowed set: everything else in them is masked
    kept_rows: Array  # [K] int64
    kept_ids: Array  # [K] int64: the allowed tokens of those rows
    banned_rows: Array  # [N] int64
    banned_ids: Array  # [N] int64: disallowed, and end tokens under min_tokens


@dataclass(frozen=True)
class StepRules:
    """A step's rules on the device, and which of their ops it needs (known on the host)."""

    penalties: Penalties[torch.Tensor] | None
    edits: Edits[torch.Tensor]
    any_bias: bool
    any_allowed: bool
    any_banned: bool


def _flat(rows: list[int], parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[N] rows and [N] ids: each part's ids with its row."""
    if not parts:
        return _NONE, _NONE
    lengths = np.fromiter(map(len, parts), np.int64, len(parts))
    return np.repeat(np.asarray(rows, np.int64), lengths), np.concatenate(parts)


class LogitRules:
    """The runner's side: the penalty counts, and the step's edits of the logits before the draw."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.counts = PenaltyCounts(vocab_size, device)
        # Its own pinned buffer, so the rules travel in one copy without reshaping the step's own.
        self._staging = Staging(device, 64 << 10) if device.type == "cuda" else None
        self._minus_inf = torch.full((), float("-inf"), device=device)

    def prepare(self, chosen: Sequence[SequenceInput]) -> StepRules | None:
        """The rules of the sampled rows `chosen`, uploaded, and the slots first used here started;
        None when no row has rules (the step does nothing more)."""
        ruled = [(row, s.rules, s.output_index) for row, s in enumerate(chosen) if s.rules is not None]
        if not ruled:
            return None
        rows, rules, _ = zip(*ruled)
        penalized = [(row, r) for row, r in zip(rows, rules) if r.penalty_slot >= 0]
        penalties = None
        if penalized:
            p_rows, p_rules = zip(*penalized)
            penalties = Penalties(
                rows=np.array(p_rows, np.int64),
                slots=np.array([r.penalty_slot for r in p_rules], np.int64),
                repetition=np.array([r.repetition_penalty for r in p_rules], np.float32),
                frequency=np.array([r.frequency_penalty for r in p_rules], np.float32),
                presence=np.array([r.presence_penalty for r in p_rules], np.float32),
            )
        starts = self.counts.starts([r for _, r in penalized])
        bias_rows, bias_ids = _flat(rows, [r.bias_ids for r in rules])
        with_allowed = [(row, r.allowed_ids) for row, r in zip(rows, rules) if r.allowed_ids is not None]
        allowed_rows = [row for row, _ in with_allowed]
        kept_rows, kept_ids = _flat(allowed_rows, [ids for _, ids in with_allowed])
        banned_rows, banned_ids = _flat(rows, [r.bans(i) for _, r, i in ruled])
        edits = Edits(
            bias_rows=bias_rows,
            bias_ids=bias_ids,
            bias_values=np.concatenate([r.bias_values for r in rules]),
            allowed_rows=np.array(allowed_rows, np.int64),
            kept_rows=kept_rows,
            kept_ids=kept_ids,
            banned_rows=banned_rows,
            banned_ids=banned_ids,
        )
        penalties, edits, starts = self._upload(penalties, edits, starts)
        if starts is not None:
            self.counts.start(starts)
        return StepRules(
            penalties=penalties,
            edits=edits,
            any_bias=bool(len(bias_ids)),
            any_allowed=bool(allowed_rows),
            any_banned=bool(len(banned_ids)),
        )

    def apply(self, step: StepRules | None, logits: torch.Tensor) -> torch.Tensor:
        """The logits [R, V] float32 after the step's rules, in this order: penalties, bias, then
        the allowed and disallowed masks and min_tokens' bans (-inf). A new tensor when a row has
        rules: `logits` stays as it was (the raw logprobs read it); `logits` itself otherwise."""
        if step is None:
            return logits
        out = logits.clone()
        if step.penalties is not None:
            self.counts.penalize(out, step.penalties)
        e = step.edits
        if step.any_bias:
            out.index_put_((e.bias_rows, e.bias_ids), e.bias_values, accumulate=True)
        if step.any_allowed:
            kept = out[e.kept_rows, e.kept_ids]  # [K]
            out.index_fill_(0, e.allowed_rows, float("-inf"))
            out.index_put_((e.kept_rows, e.kept_ids), kept)
        if step.any_banned:
            out.index_put_((e.banned_rows, e.banned_ids), self._minus_inf)
        return out

    def count(self, step: StepRules | None, drawn: torch.Tensor) -> None:
        """After the draw: the drawn tokens [R] int64 of penalized rows join their sequences' counts."""
        if step is not None and step.penalties is not None:
            self.counts.count(step.penalties, drawn)

    def _upload(self, *bundles):
        if self._staging is None:
            return tuple(map(on_cpu, bundles))
        uploaded = self._staging.upload(*bundles)
        self._staging.release()  # nothing else reads the pinned copy
        return uploaded
