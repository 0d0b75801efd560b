"""The scheduler's record of one request, and what one step's update does to it."""

import enum
from dataclasses import dataclass, field

from actors.scheduler.radix_node import MatchResult
from schemas.embed import Pooling
from schemas.generate import SamplingParams
from schemas.requests import Tenant
from schemas.step import SequenceUpdate


class State(enum.Enum):
    WAITING = "waiting"  # in the queue, holds no blocks
    RUNNING = "running"  # started on the executor: prefilling or decoding
    DRAINING = "draining"  # preempted; waits for the executor to confirm the drop before requeueing


@dataclass
class Sequence:
    """One request. Its block fields are the KV manager's (kv_manager.py), its state and place in
    the queues the request table's (request_table.py). Invariants: `computed_len` never falls
    within a run and is at most `total_len`; `prefill_done <= prefill_sent <= len(prefill_ids)`."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    origin: str
    arrival: int
    output_ids: list[int] = field(default_factory=list)
    tenant: Tenant = Tenant()  # cached KV is shared within a tenant, and across tenants once public
    fork_of: str | None = None  # another choice of the same prompt, which computes it for both
    pooling: Pooling | None = None  # an embedding: its prompt's hidden states pooled so, nothing drawn
    blocks: list[int] = field(default_factory=list)  # in position order, the cached prefix's first
    cached: MatchResult | None = None  # the prefix taken from the cache at the start, locked while running
    kv_generation: int = 0  # the cache generation (the weights) its blocks' KV was computed under
    looked_up: bool = False  # its prompt was matched against the cache once: later matches are not counted
    # The host tier's hashes of its leading whole blocks (host_tier.py), and the namespace they are under.
    block_hashes: list[bytes] = field(default_factory=list)
    hashed_under: str = ""
    disk_looked_up: bool = False  # the disk tier was asked for its prefix once (disk_tier.py)
    fetching: bool = False  # it waits for that answer
    disk_blocks: int = 0  # the blocks that answer brought into the host tier for it
    gpu_blocks_at_fetch: int = 0  # the GPU's match when the fetch was asked
    prefetched: int = 0  # the blocks its fetch's pieces loaded into the GPU's tree before its start
    piece_landed: bool = False  # a piece of its fetch came since its last prefetch
    state: State = State.WAITING
    # Of the tokens being prefilled (prompt, plus earlier outputs after a preemption): how many
    # were sent to the executor, and how many it reported computed.
    prefill_ids: list[int] = field(default_factory=list)
    prefill_sent: int = 0
    prefill_done: int = 0
    # Leading tokens whose KV the current run has written, as far as its own updates tell: what
    # may go to the prefix cache when the run ends. A drawn token gets its KV only a step later.
    computed_len: int = 0

    @property
    def prefilling(self) -> bool:
        return self.state is State.RUNNING and self.prefill_done < len(self.prefill_ids)

    @property
    def scores_prompt(self) -> bool:
        """Whether its run computes prompt logprobs: asked for, and no outputs yet (a client that has
        outputs has the prompt's logprobs, and a later run's prefill holds outputs)."""
        return self.params.prompt_logprobs_from is not None and not self.output_ids

    @property
    def reusable_len(self) -> int | None:
        """How many leading tokens it may take from the prefix cache; None: as many as are cached.
        Scoring the prompt from position s needs the logits from position s - 1 on; a mean pooled
        over the prompt needs every token's hidden state."""
        if self.pooling == "mean":
            return 0
        return max(self.params.prompt_logprobs_from - 1, 0) if self.scores_prompt else None

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_total_len(self) -> int:
        return len(self.prompt_ids) + self.params.max_tokens

    def start_run(self, computed: int) -> None:
        """A new run on the executor, with the KV of the first `computed` tokens at hand: it
        prefills the prompt and the outputs so far from there."""
        self.prefill_ids = self.prompt_ids + self.output_ids
        self.prefill_sent = self.prefill_done = self.computed_len = computed

    def record_computed(self, update: SequenceUpdate) -> bool:
        """Books the KV an update of the current run reports written; True if that completed the
        prefill."""
        was_prefilling = self.prefilling
        self.prefill_done += update.prefilled_tokens
        self.computed_len = max(self.computed_len, self.prefill_done)
        if update.token_ids and update.output_index <= len(self.output_ids):
            # the run has fed every token before the one it drew
            self.computed_len = max(self.computed_len, len(self.prompt_ids) + update.output_index)
        return was_prefilling and not self.prefilling

    def extend_outputs(self, update: SequenceUpdate) -> bool:
        """Appends the update's tokens if they continue the outputs exactly where they stand (any
        run draws the same tokens); False, and nothing appended, for a repeat or a gap."""
        if update.output_index != len(self.output_ids):
            return False
        self.output_ids += update.token_ids
        return True
