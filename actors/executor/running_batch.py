"""The executor's side of the running batch: what each admitted sequence feeds next.

The scheduler decides membership (start, prefill chunks, block grants, drops); this object turns
that into the inputs of one model step and books the sampled tokens, finishing a sequence on EOS,
a stop token id or its token limit, so a finished request costs no extra step.
"""

from collections import deque
from dataclasses import dataclass, field

from gpu.runner import SequenceInput
from schemas.generate import SamplingParams
from schemas.step import Command, CopyBlock, DropSequence, GrantBlocks, PrefillChunk, SequenceUpdate, StartSequence


@dataclass
class RunningSequence:
    request_id: str
    params: SamplingParams
    block_table: list[int]
    num_outputs: int  # output tokens drawn so far, before a preemption included
    position: int = 0  # tokens whose KV is written
    chunks: deque[PrefillChunk] = field(default_factory=deque)
    last_token: int | None = None  # drawn, not yet fed back
    stop_ids: frozenset[int] = frozenset()
    cached_tokens: int | None = None  # reported in the first update, then None


@dataclass(frozen=True)
class PlannedInput:
    """What one `SequenceInput` of a step stands for, to book its result afterwards."""

    seq: RunningSequence
    prefill_tokens: int  # 0 for a decode


class RunningBatch:
    def __init__(self, block_size: int, max_model_len: int, eos_token_ids: list[int]) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sequences: dict[str, RunningSequence] = {}
        self.dropped: list[str] = []  # dropped since the last step output
        self.copies: list[tuple[int, int]] = []  # KV blocks to copy before the next step: (source, target)

    def __len__(self) -> int:
        return len(self.sequences)

    def apply(self, command: Command) -> None:
        match command:
            case StartSequence(request_id, params, block_table, num_outputs, cached_tokens):
                stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
                # The leading blocks already hold the KV of a cached prefix: prefill starts after it.
                self.sequences[request_id] = RunningSequence(
                    request_id, params, list(block_table), num_outputs, position=cached_tokens,
                    stop_ids=stop_ids, cached_tokens=cached_tokens,
                )
            case PrefillChunk(request_id=request_id):
                if request_id in self.sequences:
                    self.sequences[request_id].chunks.append(command)
            case GrantBlocks(request_id, block_ids):
                if request_id in self.sequences:
                    self.sequences[request_id].block_table += block_ids
            case CopyBlock(source, target):
                self.copies.append((source, target))
            case DropSequence(request_id):
                self.sequences.pop(request_id, None)
                self.dropped.append(request_id)

    def drop_all(self) -> None:
        self.dropped += list(self.sequences)
        self.sequences.clear()

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def take_dropped(self) -> list[str]:
        dropped, self.dropped = self.dropped, []
        return dropped

    def plan_step(self, max_prefill_tokens: int) -> tuple[list[SequenceInput], list[PlannedInput]]:
        """Every decode that has a block for its next token, plus prefill chunks up to the budget
        (always at least one chunk, so a chunk larger than the budget still runs)."""
        inputs: list[SequenceInput] = []
        plan: list[PlannedInput] = []
        prefill_budget = max_prefill_tokens
        for seq in self.sequences.values():
            capacity = len(seq.block_table) * self.block_size
            if seq.chunks:
                chunk = seq.chunks[0]
                fits = chunk.start_position + len(chunk.token_ids) <= capacity
                if not fits or (plan and len(chunk.token_ids) > prefill_budget):
                    continue
                prefill_budget -= len(chunk.token_ids)
                inputs.append(self._input(seq, chunk.token_ids, chunk.start_position, sample=chunk.last))
                plan.append(PlannedInput(seq, len(chunk.token_ids)))
            elif seq.last_token is not None and seq.position + 1 <= capacity:
                inputs.append(self._input(seq, [seq.last_token], seq.position, sample=True))
                plan.append(PlannedInput(seq, 0))
        return inputs, plan

    def _input(self, seq: RunningSequence, token_ids: list[int], start: int, sample: bool) -> SequenceInput:
        p = seq.params
        return SequenceInput(
            token_ids=list(token_ids),
            start_position=start,
            block_table=seq.block_table,
            sample=sample,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            seed=p.seed or 0,
            output_index=seq.num_outputs,
        )

    def book(self, plan: list[PlannedInput], tokens: list[int | None]) -> list[SequenceUpdate]:
        """Records one step's results and returns them as updates for the step output."""
        updates = []
        for planned, token in zip(plan, tokens):
            seq = planned.seq
            if planned.prefill_tokens:
                seq.chunks.popleft()
                seq.position += planned.prefill_tokens
            else:
                seq.position += 1
            drawn = [] if token is None else [token]
            output_index = seq.num_outputs
            finish = self._record(seq, token) if token is not None else None
            updates.append(
                SequenceUpdate(seq.request_id, drawn, output_index, planned.prefill_tokens, finish, seq.cached_tokens)
            )
            seq.cached_tokens = None
            if finish:
                del self.sequences[seq.request_id]
        return updates

    def _record(self, seq: RunningSequence, token: int) -> str | None:
        seq.num_outputs += 1
        seq.last_token = token
        if token in seq.stop_ids:
            return "stop"
        if seq.num_outputs >= seq.params.max_tokens or seq.position + 1 >= self.max_model_len:
            return "length"
        return None
