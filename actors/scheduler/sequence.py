"""The scheduler's record of one request."""

import enum
from dataclasses import dataclass, field

from actors.scheduler.radix_node import MatchResult
from schemas.generate import SamplingParams


class State(enum.Enum):
    WAITING = "waiting"  # in the queue, holds no blocks
    RUNNING = "running"  # started on the executor: prefilling or decoding
    DRAINING = "draining"  # preempted; waits for the executor to confirm the drop before requeueing


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    origin: str
    arrival: int
    output_ids: list[int] = field(default_factory=list)
    tenant: str = ""  # cached KV is shared within a tenant, and across tenants once public
    fork_of: str | None = None  # another choice of the same prompt, which computes it for both
    blocks: list[int] = field(default_factory=list)  # in position order, the cached prefix's first
    cached: MatchResult | None = None  # the prefix taken from the cache at the start, locked while running
    looked_up: bool = False  # its prompt was matched against the cache once: later matches are not counted
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
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_total_len(self) -> int:
        return len(self.prompt_ids) + self.params.max_tokens
