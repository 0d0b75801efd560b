"""The executor's side of the running batch: what each admitted sequence feeds next.

The scheduler decides membership (start, prefill chunks, block grants, drops); this object turns
that into the inputs of one model step and books the sampled tokens, finishing a sequence on EOS,
a stop token id or its token limit, so a finished request costs no extra step.

Steps overlap: step N+1 is planned and launched before step N's tokens are booked. A sequence
whose last token is still on the device feeds it by reference (`previous_row`), and it advances
when planned, not when booked. A token limit is known when planning, so no step runs past it;
EOS or a stop id is only seen when booking, after the next step was launched, whose result for
that sequence is then discarded, as is every pending result of a sequence dropped since its launch.
A sequence its client aborted (`DropSequence(abort=True)`) ends in the next step output with
finish_reason "abort", after the last token booked for it: what the client has is all it drew.

Logprobs ride with the tokens, only for the requests that ask: the drawn token's (as
`SequenceUpdate.logprobs`, from its output index) and, for a run that scores its prompt, those of
the prompt tokens each chunk's positions predict (as `prompt_logprobs`, from their prompt position).
An embedding (`StartSequence.pooling`, max_tokens 0) draws nothing: the runner's sums of its chunks'
hidden states are added up (prompt_pool.py), and its last update carries the pooled vector.

A constrained sequence (structured output) keeps its place in its grammar (grammars.py): its first
draw is planned once the grammar is compiled, each token it draws is fed to the grammar, the grammar's
end ends it ("stop"), and a failure of the grammar (no compile, a token it rejects) ends it alone
with finish_reason "error".
"""

import numpy as np

from actors.executor.grammars import Grammars, start_grammar
from actors.executor.prompt_pool import PromptPool
from actors.executor.running_sequence import PlannedInput, RunningSequence
from actors.executor.sequence_rules import FreeSlots, token_rules
from actors.executor.step_inputs import advance, capacity, plan_chunk, sequence_input
from actors.executor.step_logprobs import wire_logprobs
from gpu.batch import FROM_PREVIOUS_STEP
from gpu.step_io import SequenceInput, StepLogprobs
from schemas.step import (
    Command,
    CopyBlock,
    DropSequence,
    GrantBlocks,
    HoldStepping,
    LoadBlocks,
    PrefillChunk,
    SaveBlocks,
    SequenceUpdate,
    StartSequence,
)

KVMove = CopyBlock | SaveBlocks | LoadBlocks  # between KV blocks and host slots, before the next step


class RunningBatch:
    """`grammars`: what constrained sequences compile their constraints with; None: the served
    model has no tokenizer to constrain with, and such a sequence fails at its start."""

    def __init__(
        self,
        block_size: int,
        max_model_len: int,
        eos_token_ids: list[int],
        vocab_size: int,
        grammars: Grammars | None = None,
    ) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.grammars = grammars
        self.rule_slots = FreeSlots()  # of the runner's per-sequence rule state
        self.sequences: dict[str, RunningSequence] = {}
        self.dropped: list[str] = []  # dropped since the last step output
        # The ends no step drew, since the last step output: aborts, and failures of a grammar.
        self.ended: list[SequenceUpdate] = []
        self.copies: list[KVMove] = []  # KV to move before the next step, in command order (kv_moves.py)
        self.held = False  # an in-place pause: plan no step; every sequence keeps its KV and its place
        # Sequences `forget_all` forgot, until the scheduler's drop of each: the outputs booked for them,
        # so that an abort among those drops still ends its request after every token it drew.
        self.forgotten: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.sequences)

    def apply(self, command: Command) -> None:
        match command:
            case StartSequence(request_id, params, block_table, num_outputs, cached_tokens):
                stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
                # The leading blocks already hold the KV of a cached prefix: prefill starts after it.
                # A run of the same id still in flight is replaced: book discards its results.
                self._forget(self.sequences.get(request_id))
                self.forgotten.pop(request_id, None)
                self.sequences[request_id] = RunningSequence(
                    request_id,
                    params,
                    list(block_table),
                    num_outputs,
                    position=cached_tokens,
                    stop_ids=stop_ids,
                    cached_tokens=cached_tokens,
                    booked_outputs=num_outputs,
                    scores_from=max(params.prompt_logprobs_from, 1)
                    if params.prompt_logprobs_from is not None and num_outputs == 0
                    else None,
                    rules=token_rules(params, command, stop_ids, self.vocab_size, self.rule_slots),
                    pool=PromptPool(command.pooling) if command.pooling else None,
                    grammar=start_grammar(self.grammars, params.constraint, command.output_ids),
                )
            case PrefillChunk(request_id=request_id):
                if request_id in self.sequences:
                    self.sequences[request_id].chunks.append(command)
            case GrantBlocks(request_id, block_ids):
                if request_id in self.sequences:
                    self.sequences[request_id].block_table += block_ids
            case CopyBlock() | SaveBlocks() | LoadBlocks():
                self.copies.append(command)
            case DropSequence(request_id, abort):
                seq = self.sequences.pop(request_id, None)
                self._forget(seq)
                self.dropped.append(request_id)
                booked = self.forgotten.pop(request_id, None) if seq is None else seq.booked_outputs
                if abort and booked is not None:
                    self.ended.append(SequenceUpdate(request_id, [], booked, finish_reason="abort"))
            case HoldStepping(hold):
                self.held = hold

    def drop_all(self) -> None:
        """Forgets every sequence, and any hold: whoever held it is gone."""
        self.held = False
        self.dropped += list(self.sequences)
        self.forget_all()
        self.forgotten.clear()

    def forget_all(self) -> None:
        """Forgets every sequence without confirming a drop: after a step the device had no memory
        for, the scheduler retracts them with drops of its own, which the next outputs confirm."""
        for seq in self.sequences.values():
            self._forget(seq)
            self.forgotten[seq.request_id] = seq.booked_outputs
        self.sequences.clear()

    def _forget(self, seq: RunningSequence | None) -> None:
        """What a sequence leaving the batch holds goes back: its rules' slot."""
        if seq is not None and seq.rules is not None and seq.rules.slot >= 0:
            self.rule_slots.give_back(seq.rules.slot)

    def take_copies(self) -> list[KVMove]:
        copies, self.copies = self.copies, []
        return copies

    def take_saves(self) -> list[SaveBlocks]:
        """The saves not yet made, taken out of the moves (before the pool may be released)."""
        saves = [move for move in self.copies if isinstance(move, SaveBlocks)]
        self.copies = [move for move in self.copies if not isinstance(move, SaveBlocks)]
        return saves

    def take_dropped(self) -> list[str]:
        dropped, self.dropped = self.dropped, []
        return dropped

    def take_ended(self) -> list[SequenceUpdate]:
        """The ends of the sequences aborted or failed since the last call: publish them after the
        updates booked meanwhile (a sequence that left the batch books none)."""
        ended, self.ended = self.ended, []
        return ended

    def _fail(self, seq: RunningSequence) -> SequenceUpdate:
        """Ends `seq`, whose grammar failed, alone: finish_reason "error" after the outputs booked for
        it, with the grammar's `Error` naming the constraint's field."""
        self._forget(self.sequences.pop(seq.request_id))
        r = seq.rules
        bans = r is not None and (r.allowed_ids is not None or r.disallowed_ids.size > 0 or r.end_bans.size > 0)
        error = seq.grammar.failure(seq.params.constraint.param, bans)
        return SequenceUpdate(seq.request_id, [], seq.booked_outputs, finish_reason="error", error=error)

    def plan_step(self, max_prefill_tokens: int) -> tuple[list[SequenceInput], list[PlannedInput]]:
        """Every decode that has a block for its next token, then prefill chunks up to the budget
        (a chunk is cut where the budget ends, and its rest goes first in the next step). Decodes come
        first so the attention backend can run them apart, with its decode kernel. The sequences
        advance as if the step ran: launch the inputs before the next plan, and book the plan after
        it (a decode reads the previous launch's tokens on the device). Held, it plans nothing: the
        step in flight is booked as usual, and its tokens are fed from the host when stepping resumes."""
        inputs: list[SequenceInput] = []
        plan: list[PlannedInput] = []
        if self.held:
            return inputs, plan
        live = [seq for seq in self.sequences.values() if not seq.exhausted]
        for seq in [seq for seq in live if seq.grammar is not None and seq.grammar.ready() and seq.grammar.error]:
            self.ended.append(self._fail(seq))
            live.remove(seq)
        for seq in live:
            has_input = seq.last_token is not None or seq.pending is not None
            if not seq.chunks and has_input and seq.position < capacity(seq, self.block_size):
                if seq.pending is not None:  # drawn by the step in flight: read on the device
                    inputs.append(sequence_input(seq, [FROM_PREVIOUS_STEP], seq.position, True, seq.pending.row))
                else:
                    inputs.append(sequence_input(seq, [seq.last_token], seq.position, True))
                seq.last_token = None
                seq.position += 1
                plan.append(advance(seq, len(inputs) - 1, 0, True, self.max_model_len))
        prefill_budget = max_prefill_tokens
        for seq in live:
            if (
                seq.chunks
                and prefill_budget > 0
                and (planned := plan_chunk(seq, prefill_budget, len(inputs), self.block_size, self.max_model_len))
            ):
                inputs.append(planned[0])
                plan.append(planned[1])
                prefill_budget -= planned[1].prefill_tokens
        return inputs, plan

    @staticmethod
    def asks_logprobs(plan: list[PlannedInput]) -> bool:
        """Whether any input of the step asked for logprobs (drawn or prompt): only then are they fetched."""
        return any(p.seq.params.logprobs or p.scored_start >= 0 for p in plan)

    def book(
        self,
        plan: list[PlannedInput],
        tokens: list[int | None],
        logprobs: list[StepLogprobs | None] | None = None,
        pooled: list[np.ndarray | None] | None = None,
    ) -> list[SequenceUpdate]:
        """Records one launched step's results (its tokens, its logprobs and its embeddings' pooled
        sums when it asked for any) and returns them as updates for the step output; an embedding's
        last update carries its vector. Results of sequences dropped or finished since the launch
        are discarded."""
        updates = []
        for planned, token in zip(plan, tokens):
            seq = planned.seq
            if self.sequences.get(seq.request_id) is not seq:
                continue
            finish = None
            if token is not None and seq.grammar is not None:
                seq.grammar.accept(planned.output_index, token)
                if seq.grammar.error:
                    updates.append(self._fail(seq))  # and not the token it refused
                    continue
            if token is not None:
                if seq.pending is planned:  # no later step reads it on the device: feed it from here
                    seq.pending, seq.last_token = None, token
                ends = token in seq.stop_ids or (seq.grammar is not None and seq.grammar.terminated)
                finish = "stop" if ends else None
                seq.booked_outputs += 1
            if planned.last and finish is None:
                finish = "length"
            if planned.pooled_tokens:
                seq.pool.add(pooled[planned.row], planned.pooled_tokens)
            step = logprobs[planned.row] if logprobs else None
            updates.append(
                SequenceUpdate(
                    seq.request_id,
                    [] if token is None else [token],
                    planned.output_index,
                    planned.prefill_tokens,
                    finish,
                    seq.cached_tokens,
                    logprobs=wire_logprobs(step.drawn, planned.output_index) if step and token is not None else None,
                    prompt_logprobs=wire_logprobs(step.prompt, planned.scored_start) if step else None,
                    embedding=seq.pool.vector() if seq.pool is not None and planned.last else None,
                )
            )
            seq.cached_tokens = None
            if finish:
                self._forget(self.sequences.pop(seq.request_id))
        return updates
