"""Admin conversations on `<ns>.admin.<verb>`, also served over HTTP under `/admin/`."""

from typing import Literal

import msgspec


class GetStats(msgspec.Struct, frozen=True, tag="get_stats"):
    pass


class SchedulerStats(msgspec.Struct, frozen=True, tag="scheduler_stats"):
    waiting: int  # requests queued, holding no blocks
    running: int  # requests started on the executor
    total_blocks: int
    free_blocks: int
    cached_blocks: int = 0  # held by the prefix cache (requests may use them too)
    evictable_blocks: int = 0  # held by the prefix cache only: free for the taking when needed
    cache_hit_tokens: int = 0  # prompt tokens served from the cache, since start
    cache_queried_tokens: int = 0  # prompt tokens looked up in the cache, since start
    preemptions: int = 0  # running requests sent back to the queue for lack of blocks, since start


class GetCache(msgspec.Struct, frozen=True, tag="get_cache"):
    pass


class CacheReport(msgspec.Struct, frozen=True, tag="cache_report"):
    total_blocks: int
    free_blocks: int  # held by nobody
    cached_blocks: int  # held by the prefix cache
    evictable_blocks: int  # cached, read by no running request
    in_use_blocks: int  # held by running requests (cached or not)
    public_blocks: int  # cached and readable by every tenant
    private_blocks: dict[str, int]  # tenant name -> cached blocks only it (and co-owners) can read
    hit_tokens: int  # prompt tokens served from the cache, since start
    queried_tokens: int  # prompt tokens looked up, since start
    hit_rate: float  # hit_tokens / queried_tokens
    # The host tier (--host-kv-blocks): its slots, those holding or saving a block, and since start
    # the blocks loaded from it instead of recomputed, and those a first lookup found on neither tier.
    host_slots: int = 0
    host_used_slots: int = 0
    host_hit_blocks: int = 0
    host_miss_blocks: int = 0
    # The disk tier (--disk-kv-gb), since start: blocks read back into the host tier, and blocks it stored.
    disk_fetched_blocks: int = 0
    disk_spilled_blocks: int = 0
    disk_pending_blocks: int = 0  # held by the host tier, not yet written to disk


class PublishPrefix(msgspec.Struct, frozen=True, tag="publish_prefix"):
    """Makes a prefix (a shared system prompt) readable by every tenant, cached now or later.
    On the bus it is token ids; the HTTP route also takes text and encodes it as a prompt."""

    input_ids: list[int]


class PrefixPublished(msgspec.Struct, frozen=True, tag="prefix_published"):
    tokens: int  # whole blocks of the prefix: what can be shared
    opened_blocks: int  # cached blocks that became public now


class FlushCache(msgspec.Struct, frozen=True, tag="flush_cache"):
    """Drops every cached block that no running request uses."""


class CacheFlushed(msgspec.Struct, frozen=True, tag="cache_flushed"):
    freed_blocks: int


PauseMode = Literal["abort", "retract", "in_place", "wait"]


class PauseGeneration(msgspec.Struct, frozen=True, tag="pause_generation"):
    """Stops generation until `ContinueGeneration`; requests that arrive meanwhile wait, admitted
    after it. `mode`: "abort" ends every request in flight with finish_reason "abort" and the
    output it has; "retract" sends the running ones back to the queue (their KV freed, recomputed
    after); "in_place" stops stepping them, their KV kept; "wait" (vLLM's) lets them finish. A pause
    while paused applies its own mode to what is in flight then, as SGLang's does."""

    mode: PauseMode = "abort"


class ContinueGeneration(msgspec.Struct, frozen=True, tag="continue_generation"):
    """Ends the pause: held requests step again, waiting ones are admitted. Refused when not paused."""


class GetPause(msgspec.Struct, frozen=True, tag="get_pause"):
    pass


class PauseState(msgspec.Struct, frozen=True, tag="pause_state"):
    paused: bool
    mode: PauseMode | None  # of the last pause; None when not paused
    aborted: int = 0  # requests this pause ended (mode "abort")
    held: int = 0  # requests in flight that do not advance while paused (running ones finish in "wait")


# What the scheduler answers on `<ns>.admin.*`, each subject its own request.
AdminRequest = GetStats | GetCache | FlushCache | PublishPrefix | PauseGeneration | ContinueGeneration | GetPause
AdminReply = SchedulerStats | CacheReport | CacheFlushed | PrefixPublished | PauseState
