"""Admin conversations on `<ns>.admin.<verb>`, also served over HTTP under `/admin/`."""

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


class FlushCache(msgspec.Struct, frozen=True, tag="flush_cache"):
    """Drops every cached block that no running request uses."""


class CacheFlushed(msgspec.Struct, frozen=True, tag="cache_flushed"):
    freed_blocks: int
