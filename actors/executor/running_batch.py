"""The executor's side of the running batch: what each admitted sequence feeds next.

The scheduler decides membership (start, prefill chunks, block grants, drops); this object turns
that into the inputs of one model step and books the sampled tokens, finishing a sequence on EOS,
a stop token id or its token limit, so a finished request costs no extra step.

Steps overlap: step N+1 is planned and launched before step N's tokens are booked. A sequence
whose last token is still on the device feeds it by reference (`previous_row`), and it advances
when planned, not when booked. A token limit is known when planning, so no step runs past it;
EOS or a stop id is only seen when booking, after the next step was launched, whose result for
that sequence is then discarded, as is every pending result of a sequence dropped since its launch.
"""

from collections import deque
from dataclasses import dataclass, field

from gpu.batch import FROM_PREVIOUS_STEP
from gpu.step_io import SequenceInput
from schemas.generate import SamplingParams
from schemas.step import Command, CopyBlock, DropSequence, GrantBlocks, PrefillChunk, SequenceUpdate, StartSequence


@dataclass
class RunningSequence:
    request_id: str
    params: SamplingParams
    block_table: list[int]
    num_outputs: int  # output tokens drawn by the steps launched so far, before a preemption included
    position: int = 0  # tokens whose KV the steps launched so far write
    chunks: deque[PrefillChunk] = field(default_factory=deque)
    last_token: int | None = None  # drawn and booked, not yet fed back
    pending: "PlannedInput | None" = None  # the launched input whose drawn token is fed next, not yet booked
    exhausted: bool = False  # the last token planned reaches max_tokens or the context: nothing more to plan
    stop_ids: frozenset[int] = frozenset()
    cached_tokens: int | None = None  # reported in the first update, then None


@dataclass(frozen=True)
class PlannedInput:
    """What one `SequenceInput` of a step stands for, to book its result afterwards."""

    seq: RunningSequence
    row: int  # its index among the step's inputs
    prefill_tokens: int  # 0 for a decode
    output_index: int  # of the token it draws (of the next one when it draws none)
    last: bool  # the token it draws is the sequence's last: max_tokens or the context is reached


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
                # A run of the same id still in flight is replaced: book discards its results.
                self.sequences[request_id] = RunningSequence(
                    request_id,
                    params,
                    list(block_table),
                    num_outputs,
                    position=cached_tokens,
                    stop_ids=stop_ids,
                    cached_tokens=cached_tokens,
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
        """Every decode that has a block for its next token, then prefill chunks up to the budget
        (a chunk is cut where the budget ends, and its rest goes first in the next step). Decodes come
        first so the attention backend can run them apart, with its decode kernel. The sequences
        advance as if the step ran: launch the inputs before the next plan, and book the plan after
        it (a decode reads the previous launch's tokens on the device)."""
        inputs: list[SequenceInput] = []
        plan: list[PlannedInput] = []
        live = [seq for seq in self.sequences.values() if not seq.exhausted]
        for seq in live:
            has_input = seq.last_token is not None or seq.pending is not None
            if not seq.chunks and has_input and seq.position < self._capacity(seq):
                if seq.pending is not None:  # drawn by the step in flight: read on the device
                    inputs.append(self._input(seq, [FROM_PREVIOUS_STEP], seq.position, True, seq.pending.row))
                else:
                    inputs.append(self._input(seq, [seq.last_token], seq.position, True))
                seq.last_token = None
                seq.position += 1
                plan.append(self._advance(seq, len(inputs) - 1, 0, True))
        prefill_budget = max_prefill_tokens
        for seq in live:
            if not seq.chunks or prefill_budget == 0:
                continue
            chunk = seq.chunks[0]
            # As much of the chunk as the budget and the sequence's blocks take: the rest waits.
            taken = min(len(chunk.token_ids), prefill_budget, self._capacity(seq) - chunk.start_position)
            if taken <= 0:
                continue
            if taken == len(chunk.token_ids):
                seq.chunks.popleft()
            else:
                seq.chunks[0] = PrefillChunk(
                    seq.request_id, chunk.token_ids[taken:], chunk.start_position + taken, chunk.last
                )
            last = chunk.last and taken == len(chunk.token_ids)
            prefill_budget -= taken
            inputs.append(self._input(seq, list(chunk.token_ids[:taken]), chunk.start_position, last))
            seq.position += taken
            plan.append(self._advance(seq, len(inputs) - 1, taken, last))
        return inputs, plan

    def _capacity(self, seq: RunningSequence) -> int:
        """Tokens its granted blocks hold."""
        return len(seq.block_table) * self.block_size

    def _input(
        self, seq: RunningSequence, token_ids: list[int], start: int, sample: bool, previous_row: int = -1
    ) -> SequenceInput:
        p = seq.params
        return SequenceInput(
            token_ids=token_ids,
            start_position=start,
            block_table=seq.block_table,
            sample=sample,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            min_p=p.min_p,
            seed=p.seed or 0,
            output_index=seq.num_outputs,
            previous_row=previous_row,
        )

    def _advance(self, seq: RunningSequence, row: int, prefill_tokens: int, sample: bool) -> PlannedInput:
        """Counts the token the input draws, if any, and makes it the sequence's next input."""
        if not sample:
            return PlannedInput(seq, row, prefill_tokens, seq.num_outputs, last=False)
        seq.num_outputs += 1
        last = seq.num_outputs >= seq.params.max_tokens or seq.position + 1 >= self.max_model_len
        planned = PlannedInput(seq, row, prefill_tokens, seq.num_outputs - 1, last)
        seq.pending, seq.exhausted = (None, True) if last else (planned, False)
        return planned

    def book(self, plan: list[PlannedInput], tokens: list[int | None]) -> list[SequenceUpdate]:
        """Records one launched step's results and returns them as updates for the step output.
        Results of sequences dropped or finished since the launch are discarded."""
        updates = []
        for planned, token in zip(plan, tokens):
            seq = planned.seq
            if self.sequences.get(seq.request_id) is not seq:
                continue
            finish = None
            if token is not None:
                if seq.pending is planned:  # no later step reads it on the device: feed it from here
                    seq.pending, seq.last_token = None, token
                finish = "stop" if token in seq.stop_ids else "length" if planned.last else None
            updates.append(
                SequenceUpdate(
                    seq.request_id,
                    [] if token is None else [token],
                    planned.output_index,
                    planned.prefill_tokens,
                    finish,
                    seq.cached_tokens,
                )
            )
            seq.cached_tokens = None
            if finish:
                del self.sequences[seq.request_id]
        return updates
