"""Scheduler <-> executor: the hot loop.

The scheduler owns block ids and decides what runs; the executor keeps the admitted batch and
steps it on its own, so no bus round trip sits between two GPU steps. Commands are deltas,
published without waiting; the executor answers each step with one `StepOutput` that carries
every sequence's new tokens, which the scheduler and the tokenizers consume.
"""

import msgspec

from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import SamplingParams, TokenLogprobs


class StartSequence(msgspec.Struct, frozen=True, tag="start"):
    request_id: str
    params: SamplingParams
    block_table: list[int]
    num_output_tokens: int = 0  # outputs generated before a preemption: they count toward max_tokens
    cached_tokens: int = 0  # leading tokens whose KV the block table already holds (a cached prefix)
    # The prompt, set when the request has a repetition penalty, which counts it from the start.
    penalty_prompt_ids: list[int] = []
    # The outputs generated before a preemption or a migration, set when the run needs them: a
    # penalty counts them, a constraint's grammar replays them.
    output_ids: list[int] = []
    pooling: Pooling | None = None  # an embedding: its prompt's final hidden states pooled so, no token drawn


class PrefillChunk(msgspec.Struct, frozen=True, tag="prefill"):
    request_id: str
    token_ids: list[int]
    start_position: int
    last: bool  # the final chunk: its last position draws the next token
    # The prompt token after the chunk, set when the request asks for prompt logprobs (the logprob of
    # that token is computed at the chunk's last position); None after the prompt's last chunk.
    next_token: int | None = None


class GrantBlocks(msgspec.Struct, frozen=True, tag="grant"):
    request_id: str
    block_ids: list[int]


class CopyBlock(msgspec.Struct, frozen=True, tag="copy"):
    """Copy one KV block before the next step: a forked choice gets its own copy of the block its
    prompt ends in, since it writes its own tokens after the shared ones."""

    source: int
    target: int


class SaveBlocks(msgspec.Struct, frozen=True, tag="save"):
    """Copy KV blocks to host slots (the host tier), before the next step and beside it: block
    `blocks[i]` to slot `slots[i]`. The scheduler keeps the blocks from reuse until a later
    `StepOutput.saved_slots` names the slots; cached blocks are read-only, so the copy races nothing."""

    blocks: list[int]
    slots: list[int]


class LoadBlocks(msgspec.Struct, frozen=True, tag="load"):
    """Copy host slots back into KV blocks before the next step: slot `slots[i]` to block `blocks[i]`
    (confirmed-saved slots only); the sequences started after it read them as a cached prefix. The
    scheduler refills none of the slots (no save, no fetch from disk) until a later
    `StepOutput.loaded_slots` names them: the copy has read them."""

    slots: list[int]
    blocks: list[int]


class DropSequence(msgspec.Struct, frozen=True, tag="drop"):
    """Forget a sequence: aborted, preempted, or finished by a stop string."""

    request_id: str
    # Aborted by its client, who keeps its output: the next step output ends it with finish_reason
    # "abort", after every token it drew.
    abort: bool = False


class HoldStepping(msgspec.Struct, frozen=True, tag="hold"):
    """An in-place pause: with `hold` the executor launches no step (the one in flight is booked)
    and its sequences keep their KV and their place; without, stepping resumes where it stopped.
    Default-safe: an executor steps unless held, and a new scheduler's first commands release the
    hold, so a scheduler that dies while paused leaves no executor stuck."""

    hold: bool


Command = StartSequence | PrefillChunk | GrantBlocks | CopyBlock | SaveBlocks | LoadBlocks | DropSequence | HoldStepping


class Commands(msgspec.Struct, frozen=True):
    scheduler_id: str  # a new scheduler process: the executor drops what the old one started
    commands: list[Command]


class SequenceUpdate(msgspec.Struct, frozen=True):
    request_id: str
    token_ids: list[int]  # tokens drawn this step (none for a non-final prefill chunk)
    output_index: int = 0  # the position of token_ids[0] among the request's outputs
    prefilled_tokens: int = 0  # prompt tokens computed this step
    # "stop" (EOS, a stop token id, or a constraint's grammar ended), "length", "abort", or "error"
    # (then `error` says why: the request failed, the batch goes on)
    finish_reason: str | None = None
    cached_tokens: int | None = None  # set on the first update after a start: prompt tokens reused from the cache
    logprobs: TokenLogprobs | None = None  # of token_ids (start: output_index), when the request asks
    prompt_logprobs: TokenLogprobs | None = None  # of the prompt tokens scored this step (start: their position)
    embedding: bytes | None = None  # with an embedding's end: its pooled vector, float32 little-endian [hidden]
    error: Error | None = None  # with finish_reason "error"

    def continues(self, count: int) -> bool:
        """Whether this update holds output `count`, the next after a consumer's first `count`:
        after a restart upstream a run may repeat outputs a consumer has, or skip ahead of it while
        the resubmitted run catches up, and only the exact continuation counts."""
        return self.output_index <= count < self.output_index + len(self.token_ids)


class OutOfMemory(msgspec.Struct, frozen=True):
    """The device had no memory for a step: the executor launched none of it and forgot every
    sequence it ran, confirming no drop (the tokens they drew before are in this output or earlier).
    The scheduler retracts its running sequences, which wait and are recomputed, and runs fewer."""

    sequences: int  # in the step that failed
    tokens: int  # fed in it: prompt chunks and decodes
    message: str  # torch's


class StepOutput(msgspec.Struct, frozen=True):
    executor_id: str
    step: int
    updates: list[SequenceUpdate]
    # Sequences dropped since the last output: every token they drew is in this or an earlier output.
    dropped: list[str] = []
    weight_version: str = "default"  # of the weights that computed this step's tokens
    out_of_memory: OutOfMemory | None = None  # the next step failed so; set on an output's last part
    saved_slots: list[int] = []  # host slots whose SaveBlocks copy is done since the last output (last part)
    unsaved_slots: list[int] = []  # host slots whose save was abandoned (the pool was released first)
    # Host slots whose LoadBlocks copy has read them since the last output (last part), once per load.
    loaded_slots: list[int] = []
    # The scheduler whose commands the executor runs ("": none yet): the slots above are its moves.
    scheduler_id: str = ""


class DescribeExecutor(msgspec.Struct, frozen=True, tag="describe"):
    # After a bus outage the scheduler cannot know which commands and outputs were lost: with
    # `resync` the executor drops its batch and answers under a new executor_id, so both restart
    # from the scheduler's table and outputs of the old batch are recognisably stale.
    resync: bool = False


class ExecutorInfo(msgspec.Struct, frozen=True, tag="executor_info"):
    """Sent on request and broadcast when an executor starts, so a scheduler learns of restarts."""

    executor_id: str
    num_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    device: str
    dtype: str
    weight_version: str = "default"  # of the weights it serves now
    host_kv_slots: int = 0  # the host tier's slots (one block of every layer each); 0: no host tier
    host_segment: str = ""  # the host tier's shared-memory segment, which the cache_tier maps by name
    # actors/lib/block_hashes.py's name of the weights served now: the checkpoint's at start, another
    # after each update. Cached KV is filed under it, so none computed under other weights is served.
    weights_fingerprint: str = ""
    steps: int = 0  # steps with news (each published as a StepOutput) since it started
    kv_block_bytes: int = 0  # one KV block of every layer, K and V: a host slot's size
