"""One sequence's input to a step (running_batch.py plans the step): a prompt chunk cut to the
prefill budget and its granted blocks, the `SequenceInput` the runner takes, and the count of the
token it draws, which advances the sequence when planned, not when booked."""

from dataclasses import replace

from actors.executor.running_sequence import PlannedInput, RunningSequence
from actors.executor.sequence_rules import temperature_at
from actors.executor.step_logprobs import scored_targets
from gpu.step_io import SequenceInput
from schemas.step import PrefillChunk


def plan_chunk(
    seq: RunningSequence, budget: int, row: int, block_size: int, max_model_len: int
) -> tuple[SequenceInput, PlannedInput] | None:
    """As much of `seq`'s next chunk as `budget` and its blocks take, as input `row`; the rest
    waits, first in line, for the next step. None if its blocks take none."""
    chunk = seq.chunks[0]
    taken = min(len(chunk.token_ids), budget, capacity(seq, block_size) - chunk.start_position)
    if chunk.last and seq.grammar is not None and not seq.grammar.ready():
        taken = min(taken, len(chunk.token_ids) - 1)  # its draw waits for the grammar's compile
    if taken <= 0:
        return None
    if taken == len(chunk.token_ids):
        seq.chunks.popleft()
        next_token = chunk.next_token
    else:
        rest = chunk.token_ids[taken:]
        seq.chunks[0] = PrefillChunk(seq.request_id, rest, chunk.start_position + taken, chunk.last, chunk.next_token)
        next_token = rest[0]
    token_ids = list(chunk.token_ids[:taken])
    final = chunk.last and taken == len(chunk.token_ids)
    draws = final and seq.num_outputs < seq.params.max_tokens  # max_tokens 0: the prompt alone
    scored_from, targets = scored_targets(seq.scores_from, token_ids, chunk.start_position, next_token, final)
    pooled = seq.pool.tokens_of(taken, final) if seq.pool else 0
    chunk_input = sequence_input(seq, token_ids, chunk.start_position, draws, -1, scored_from, targets, pooled)
    seq.position += taken
    planned = advance(seq, row, taken, draws, max_model_len)
    if pooled:
        planned = replace(planned, pooled_tokens=pooled)
    if final and not draws:
        planned = replace(planned, last=True)
        seq.exhausted = True
    if targets:
        planned = replace(planned, scored_start=chunk.start_position + scored_from + 1)
    return chunk_input, planned


def capacity(seq: RunningSequence, block_size: int) -> int:
    """Tokens its granted blocks hold."""
    return len(seq.block_table) * block_size


def sequence_input(
    seq: RunningSequence,
    token_ids: list[int],
    start: int,
    sample: bool,
    previous_row: int = -1,
    scored_from: int = 0,
    scored_targets: tuple[int, ...] = (),
    pooled_tokens: int = 0,
) -> SequenceInput:
    """The runner's input of `token_ids` from position `start`, with `seq`'s sampling parameters."""
    p = seq.params
    return SequenceInput(
        token_ids=token_ids,
        start_position=start,
        block_table=seq.block_table,
        sample=sample,
        temperature=temperature_at(p, seq.num_outputs),
        top_p=p.top_p,
        top_k=p.top_k,
        min_p=p.min_p,
        seed=p.seed or 0,
        output_index=seq.num_outputs,
        previous_row=previous_row,
        logprobs=p.logprobs,
        top_logprobs=p.top_logprobs,
        logprob_token_ids=tuple(p.logprob_token_ids),
        processed_logprobs=p.processed_logprobs,
        scored_from=scored_from,
        scored_targets=scored_targets,
        rules=seq.rules,
        pooled_tokens=pooled_tokens,
    )


def advance(seq: RunningSequence, row: int, prefill_tokens: int, sample: bool, max_model_len: int) -> PlannedInput:
    """Counts the token the input draws, if any, and makes it the sequence's next input."""
    if not sample:
        return PlannedInput(seq, row, prefill_tokens, seq.num_outputs, last=False)
    seq.num_outputs += 1
    last = seq.num_outputs >= seq.params.max_tokens or seq.position + 1 >= max_model_len
    planned = PlannedInput(seq, row, prefill_tokens, seq.num_outputs - 1, last)
    seq.pending, seq.exhausted = (None, True) if last else (planned, False)
    return planned
