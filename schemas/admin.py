"""Admin conversations on `<ns>.admin.<verb>`, also served over HTTP under `/admin/`."""

from typing import Annotated, Literal, get_args

import msgspec

TierName = Literal["gpu", "host", "disk"]
FlushTier = Literal["gpu", "host", "disk", "all"]
# msgspec's JSON Schema of a dict leaves its keys free: /openapi.json names them from this.
TIER_KEYS = msgspec.Meta(extra_json_schema={"propertyNames": {"enum": list(get_args(TierName))}})


class TierFigures(msgspec.Struct, frozen=True):
    """One tier of the KV cache: the GPU's prefix cache, the host tier (--host-kv-blocks), the disk
    tier (--disk-kv-gb). `hits` and `lookups` count whole blocks of each request's first lookup since
    the scheduler started: the GPU is asked for every whole block of its tokens, the host for those
    after the GPU's, the disk for those after the host's. So a tier's lookups are the lookups of the
    one before less its hits, and every block a request did not compute is the hit of one tier."""

    blocks: int  # held now (the GPU's: in its prefix cache)
    bytes: int  # their bytes (the disk's: its files', headers included)
    capacity_blocks: int  # the disk's: what its bytes would hold without the files' headers
    capacity_bytes: int
    hits: int
    lookups: int
    hit_rate: float  # hits / lookups; 0 before any lookup
    # On their way in: to the host, copies from the GPU and reads from disk under way; to disk, host
    # blocks not written yet.
    pending_blocks: int = 0


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
    tiers: Annotated[dict[TierName, TierFigures], TIER_KEYS] = {}  # the tiers this server has, as CacheReport's
    # Prompt tokens loaded from the host or the disk tier instead of recomputed, since start (as
    # vLLM's KV connector counts its hits).
    offload_hit_tokens: int = 0


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
    tiers: Annotated[dict[TierName, TierFigures], TIER_KEYS] = {}  # "gpu"; "host", "disk" where this server has them


class PublishPrefix(msgspec.Struct, frozen=True, tag="publish_prefix"):
    """Makes a prefix (a shared system prompt) readable by every tenant, cached now or later.
    On the bus it is token ids; the HTTP route also takes text and encodes it as a prompt."""

    input_ids: list[int]


class PrefixPublished(msgspec.Struct, frozen=True, tag="prefix_published"):
    tokens: int  # whole blocks of the prefix: what can be shared
    opened_blocks: int  # cached blocks that became public now


class FlushCache(msgspec.Struct, frozen=True, tag="flush_cache"):
    """Empties a tier of the KV cache, or all of them. "gpu": drops every cached block that no
    running request uses. "host": drops every block of the host tier (copies under way are dropped
    when done). "disk": deletes every block file of the disk tier, of every namespace. "all": the
    three, the GPU and the host first. A request whose blocks go meanwhile computes them again.
    Flushing a tier this server lacks frees nothing."""

    tier: FlushTier = "gpu"


class CacheFlushed(msgspec.Struct, frozen=True, tag="cache_flushed"):
    freed_blocks: int  # over the tiers flushed
    tiers: Annotated[dict[TierName, int], TIER_KEYS] = {}  # the blocks each tier flushed dropped


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
