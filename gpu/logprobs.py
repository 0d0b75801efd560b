"""Logprobs of a step's tokens, computed on the device right behind the draw, with no host sync.

`LogprobRequests.of` reads the step's asks while it is prepared, and is None when no sequence asks:
such a step does no logprob work at all. Otherwise, for each row that asks (a drawn token, or a
scored prompt target) the device takes the token's logprob, the k most likely tokens' (k the step's
largest `top_logprobs`) and the asked ids', and packs them all into one float32 array, copied to
pinned memory behind the drawn tokens; `LogprobRequests.unpack` cuts it per sequence on the host once
the step's one sync has passed. Rows are computed in chunks, so a long prompt scored whole never
holds its [N, vocab] logits at once.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple

import numpy as np
import torch

from gpu.logprob_kernel import token_logprobs_on_gpu
from gpu.sampler import GREEDY_BELOW_TEMPERATURE, filter_min_p, filter_top_k_top_p
from gpu.staging import Array
from gpu.step_io import PositionLogprobs, SequenceInput, StepLogprobs

MAX_TOP_LOGPROBS = 20
# Rows are computed in chunks of at most this many logits (rows x vocab), each with about 10 bytes
# of temporaries (its log_softmax, the running count of ties): a bounded amount, however long a
# prompt is scored.
CHUNK_LOGITS = 1 << 25
# Top ids travel in the float32 result, exact below 2^24 (vocabularies are a few hundred thousand).
_EXACT_IDS = 1 << 24


class LogprobArrays(NamedTuple, Generic[Array]):
    """What the step's logprob asks need on the device, uploaded with the step."""

    drawn_rows: Array  # [L] int64: the drawing rows (of the step's R) whose token's logprobs are asked
    drawn_ids: Array  # [L * A] int64: each one's asked token ids, padded with 0 to the step's most, A
    processed_rows: Array  # [P] int64: those of the L rows that ask for the distribution drawn from
    temperature: Array  # [P] float32; 1 for a greedy row
    top_k: Array  # [P] int64; <= 0 keeps every token
    top_p: Array  # [P] float32
    min_p: Array  # [P] float32
    scored_index: Array  # [N] int64: the step's tokens whose logits score a prompt target
    scored_targets: Array  # [N] int64
    scored_ids: Array  # [N * B] int64: each scored position's sequence's asked ids, padded to B


@dataclass(frozen=True)
class EntryLayout:
    """Where one kind of entry (the drawn tokens', or the scored targets') lies in the packed result:
    a [rows, width] block, each row its token's logprob, `top` top logprobs, `asked` asked ids'
    logprobs, then the `top` top ids."""

    seqs: list[int]  # the sequences with entries, in order
    starts: list[int]  # each one's first row in the block
    counts: list[int]  # and its number of rows
    tops: list[int]  # each one's top_logprobs
    num_asked: list[int]  # each one's number of asked ids
    rows: int
    top: int  # the largest of `tops`
    asked: int  # the largest of `num_asked`

    @classmethod
    def of(cls, seqs: list[int], counts: list[int], inputs: Sequence[SequenceInput]) -> "EntryLayout":
        tops = [inputs[i].top_logprobs for i in seqs]
        num_asked = [len(inputs[i].logprob_token_ids) for i in seqs]
        starts = np.cumsum([0, *counts[:-1]]).tolist()
        return cls(seqs, starts, counts, tops, num_asked, sum(counts), max(tops), max(num_asked))

    @property
    def width(self) -> int:
        return 1 + 2 * self.top + self.asked

    @property
    def size(self) -> int:
        return self.rows * self.width

    def cut(self, packed: np.ndarray) -> dict[int, PositionLogprobs]:
        """Each sequence's entries, from its block `packed` [size] float32 on the host."""
        block = packed.reshape(self.rows, self.width)
        top, asked = self.top, self.asked
        logprobs = block[:, 0].tolist()
        top_logprobs = block[:, 1 : 1 + top].tolist()
        asked_logprobs = block[:, 1 + top : 1 + top + asked].tolist()
        top_ids = block[:, 1 + top + asked :].astype(np.int64).tolist()
        cut = {}
        # Rows are cut to the sequence's own widths only where they differ from the block's: at a
        # large batch this loop is on the host's path every step.
        for seq, start, count, k, n in zip(self.seqs, self.starts, self.counts, self.tops, self.num_asked):
            rows = slice(start, start + count)
            cut[seq] = PositionLogprobs(
                logprobs=logprobs[rows],
                top_ids=top_ids[rows] if k == top else [r[:k] for r in top_ids[rows]],
                top_logprobs=top_logprobs[rows] if k == top else [r[:k] for r in top_logprobs[rows]],
                id_logprobs=asked_logprobs[rows] if n == asked else [r[:n] for r in asked_logprobs[rows]],
            )
        return cut


def _asks(s: SequenceInput) -> bool:
    return (s.logprobs and s.sample) or bool(s.scored_targets)


@dataclass(frozen=True)
class LogprobRequests:
    """A step's logprob asks, laid out on the host: the arrays to upload with the step, and where
    each sequence's entries lie in the packed result."""

    arrays: LogprobArrays[np.ndarray]
    drawn: EntryLayout | None  # the drawn tokens asked; None when none is
    scored: EntryLayout | None  # the scored prompt targets; None when none is
    every_row: bool  # every drawing row asks for its token's logprobs (no gather)
    filters_top: bool  # a processed row has a top-k or top-p
    filters_min_p: bool  # a processed row has a min-p

    @classmethod
    def of(
        cls, inputs: Sequence[SequenceInput], rows: np.ndarray, query_start: np.ndarray, vocab_size: int
    ) -> "LogprobRequests | None":
        """The asks of a step's `inputs`, whose sequences `rows` [R] draw and whose tokens lie at
        `query_start` [S+1]; None when none asks. Raises ValueError naming the first bad ask."""
        asking = [i for i, s in enumerate(inputs) if _asks(s)]
        if not asking:
            return None
        if vocab_size > _EXACT_IDS:
            raise ValueError(f"logprobs need a vocabulary below {_EXACT_IDS} tokens, got {vocab_size}")
        for i in asking:
            _check(i, inputs[i], vocab_size)
        drawing = [j for j, i in enumerate(rows.tolist()) if inputs[i].logprobs]  # [L] indices into R
        drawn_seqs = rows[drawing].tolist()
        scored_seqs = [i for i in asking if inputs[i].scored_targets]
        drawn = EntryLayout.of(drawn_seqs, [1] * len(drawn_seqs), inputs) if drawn_seqs else None
        scored = None
        if scored_seqs:
            scored = EntryLayout.of(scored_seqs, [len(inputs[i].scored_targets) for i in scored_seqs], inputs)
        processed = [j for j, i in enumerate(drawn_seqs) if inputs[i].processed_logprobs]  # [P] indices into L
        chosen = [inputs[drawn_seqs[j]] for j in processed]
        top_k = np.array([s.top_k for s in chosen], np.int64)
        top_p = np.array([s.top_p for s in chosen], np.float32)
        min_p = np.array([s.min_p for s in chosen], np.float32)
        arrays = LogprobArrays(
            drawn_rows=np.array(drawing, np.int64),
            drawn_ids=_padded_ids(inputs, drawn),
            processed_rows=np.array(processed, np.int64),
            temperature=np.array([_temperature(s) for s in chosen], np.float32),
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            scored_index=_scored_index([inputs[i] for i in scored_seqs], query_start[scored_seqs]),
            scored_targets=np.fromiter((t for i in scored_seqs for t in inputs[i].scored_targets), np.int64),
            scored_ids=_padded_ids(inputs, scored),
        )
        return cls(
            arrays=arrays,
            drawn=drawn,
            scored=scored,
            every_row=len(drawing) == len(rows),
            filters_top=bool(((top_k > 0) | (top_p < 1)).any()),
            filters_min_p=bool((min_p > 0).any()),
        )

    def compute(
        self,
        arrays: LogprobArrays[torch.Tensor],
        raw: torch.Tensor,
        adjusted: torch.Tensor,
        drawn: torch.Tensor,
        scored_logits: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> torch.Tensor:
        """The packed result [size] float32, enqueued on the device. `arrays`: this step's, uploaded;
        `raw`: the drawing rows' logits [R, vocab] float32 as the model gave them (not written here);
        `adjusted`: the logits the draw used after the token rules (`raw` itself without rules);
        `drawn` [R] int64; `scored_logits(index)`: float32 logits [n, vocab] of the step's tokens at
        `index` [n] (None when nothing is scored)."""
        blocks = []
        chunk = max(1, CHUNK_LOGITS // raw.shape[-1])  # rows
        if self.drawn is not None:
            logits, tokens = self._drawn_logits(arrays, raw, adjusted, drawn)  # [L, vocab], [L]
            ids = arrays.drawn_ids.view(self.drawn.rows, self.drawn.asked)  # [L, A]
            for start in range(0, self.drawn.rows, chunk):
                rows = slice(start, start + chunk)
                blocks.append(token_logprobs(logits[rows], tokens[rows], self.drawn.top, ids[rows]))
        if self.scored is not None:
            ids = arrays.scored_ids.view(self.scored.rows, self.scored.asked)  # [N, B]
            for start in range(0, self.scored.rows, chunk):
                rows = slice(start, start + chunk)
                logits = scored_logits(arrays.scored_index[rows])  # [n, vocab]
                blocks.append(token_logprobs(logits, arrays.scored_targets[rows], self.scored.top, ids[rows]))
        return torch.cat([block.flatten() for block in blocks])

    def _drawn_logits(
        self, arrays: LogprobArrays[torch.Tensor], raw: torch.Tensor, adjusted: torch.Tensor, drawn: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The L asking rows' logits [L, vocab] (the raw ones, or for a processed row those of the
        distribution it drew from) and drawn tokens [L]."""
        rows = arrays.drawn_rows  # [L]
        logits = raw if self.every_row else raw.index_select(0, rows)  # [L, vocab]
        tokens = drawn if self.every_row else drawn.index_select(0, rows)  # [L]
        if len(arrays.processed_rows):
            chosen = adjusted.index_select(0, rows.index_select(0, arrays.processed_rows))  # [P, vocab]
            processed = processed_logits(chosen, arrays, self.filters_top, self.filters_min_p)
            logits = logits.index_copy(0, arrays.processed_rows, processed)  # a new tensor: raw stays as it is
        return logits, tokens

    def unpack(self, packed: np.ndarray, num_seqs: int) -> list[StepLogprobs | None]:
        """One entry per sequence of the step (None where it asked nothing), from the packed result
        [size] float32 on the host."""
        drawn_size = self.drawn.size if self.drawn is not None else 0
        drawn = self.drawn.cut(packed[:drawn_size]) if self.drawn is not None else {}
        prompt = self.scored.cut(packed[drawn_size:]) if self.scored is not None else {}
        return [
            StepLogprobs(drawn=drawn.get(i), prompt=prompt.get(i)) if i in drawn or i in prompt else None
            for i in range(num_seqs)
        ]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int, ids: torch.Tensor) -> torch.Tensor:
    """Per row: the log_softmax of `tokens`' logit, of the `top` most likely (most likely first, ties
    by lower id) and of the asked `ids`, then those top ids as float32. logits: [n, V] float32; tokens: [n] int64; ids: [n, A] int64 -> [n, 1 + top + A + top]
    On CUDA two kernels compute the same (gpu/logprob_kernel.py)."""
    if logits.is_cuda:
        return token_logprobs_on_gpu(logits, tokens, top, ids)
    logprobs = logits.log_softmax(dim=-1)  # [n, V]
    top_ids = ranked_top(logprobs, top)  # [n, top]
    chosen = torch.cat([tokens[:, None], top_ids, ids], dim=1)  # [n, 1 + top + A]
    return torch.cat([logprobs.gather(1, chosen), top_ids.float()], dim=1)


def ranked_top(values: torch.Tensor, top: int) -> torch.Tensor:
    """The ids of the `top` largest values of each row, largest first, equal values by lower id (which
    torch.topk leaves open). values: [n, V] float32 -> [n, top] int64"""
    n, vocab = values.shape
    if top == 0:
        return torch.zeros(n, 0, dtype=torch.int64, device=values.device)
    best, best_ids = values.topk(top, dim=-1)  # [n, top], largest first; among equal values, any ids
    kth = best[:, -1:]  # [n, 1]
    # Every token above the kth value is among `best`: only their order needs fixing, a sort of `top`.
    above = (best > kth).sum(dim=-1, keepdim=True)  # [n, 1]
    keys = _value_then_lower_id(best, best_ids, vocab).sort(dim=-1, descending=True).values  # [n, top]
    above_ids = vocab - 1 - (keys & 0xFFFFFFFF)
    # The rest equal the kth value, and the lowest ids of those are wanted: the j-th is where the
    # running count of tokens equal to it reaches j.
    slots = torch.arange(top, device=values.device)  # [top]
    equal = (values == kth).cumsum(dim=-1, dtype=torch.int32)  # [n, V]
    tie_ids = torch.searchsorted(equal, (slots + 1).to(torch.int32).expand(n, top).contiguous())  # [n, top]
    return torch.where(slots < above, above_ids, tie_ids.gather(1, (slots - above).clamp(min=0)))


def _value_then_lower_id(values: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """int64 keys that order as (value, -id): the value's float32 bits made to order as the floats do
    (a negative float's magnitude bits flipped; + 0.0 makes -0.0 equal 0.0), above the reversed id.
    values: [n, k] float32; ids: [n, k] int64 -> [n, k] int64"""
    bits = (values + 0.0).view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    return ordered * (1 << 32) + (vocab - 1 - ids)


def processed_logits(logits: torch.Tensor, arrays: LogprobArrays[torch.Tensor], top: bool, min_p: bool) -> torch.Tensor:
    """What each processed row draws from, as gpu/sampler.py:sample computes it: divided by its
    temperature (1 for a greedy row), then with -inf outside its top-k and top-p (when `top`) and
    below its min-p (when `min_p`). logits: [P, V] float32 -> [P, V]"""
    scaled = logits / arrays.temperature[:, None]
    if top:
        scaled = filter_top_k_top_p(scaled, arrays.top_k, arrays.top_p)
    if min_p:
        scaled = filter_min_p(scaled, arrays.min_p)
    return scaled


def _check(i: int, s: SequenceInput, vocab_size: int) -> None:
    if not 0 <= s.top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"sequence {i}: top_logprobs must be 0..{MAX_TOP_LOGPROBS}, got {s.top_logprobs}")
    if not all(0 <= t < vocab_size for t in s.logprob_token_ids):
        raise ValueError(f"sequence {i}: logprob_token_ids must be token ids below {vocab_size}")
    if not s.scored_targets:
        return
    scorable = len(s.token_ids) - 1 if s.sample else len(s.token_ids)  # a drawing chunk's last position draws
    if s.scored_from < 0 or s.scored_from + len(s.scored_targets) > scorable:
        raise ValueError(
            f"sequence {i}: scored_targets must score fed positions within 0..{scorable - 1}, got "
            f"{len(s.scored_targets)} from scored_from {s.scored_from}"
        )
    if not all(0 <= t < vocab_size for t in s.scored_targets):
        raise ValueError(f"sequence {i}: scored_targets must be token ids below {vocab_size}")


def _temperature(s: SequenceInput) -> float:
    return s.temperature if s.temperature >= GREEDY_BELOW_TEMPERATURE else 1.0


def _padded_ids(inputs: Sequence[SequenceInput], layout: EntryLayout | None) -> np.ndarray:
    """[rows * A] int64: the asked ids of each sequence with entries on each of its rows, padded with
    0 to the layout's A."""
    if layout is None or layout.asked == 0:
        return np.zeros(0, np.int64)
    ids = np.zeros((layout.rows, layout.asked), np.int64)
    for seq, start, count in zip(layout.seqs, layout.starts, layout.counts):
        asked = inputs[seq].logprob_token_ids
        ids[start : start + count, : len(asked)] = asked
    return ids.reshape(-1)


def _scored_index(inputs: list[SequenceInput], firsts: np.ndarray) -> np.ndarray:
    """[N] int64: the step's tokens whose logits score the inputs' targets; `firsts` [n] are the
    inputs' first tokens in the step."""
    if not inputs:
        return np.zeros(0, np.int64)
    return np.concatenate(
        [np.arange(len(s.scored_targets)) + first + s.scored_from for s, first in zip(inputs, firsts)]
    )
