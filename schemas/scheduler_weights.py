"""weight_sync -> scheduler, on `<ns>.scheduler.weights`: after the executor committed new weights
(schemas/executor_weights.py), before generation resumes.
"""

import msgspec


class WeightsCommitted(msgspec.Struct, frozen=True, tag="weights_committed"):
    """The scheduler's prefix cache starts a new generation of keys unless `keep_cache`: KV
    computed under the old weights (cached, or held by requests that go on in place) is never
    matched again, and the cached part is freed."""

    version: str
    keep_cache: bool


class CacheGeneration(msgspec.Struct, frozen=True, tag="cache_generation"):
    generation: int  # the prefix cache's key generation now
    freed_blocks: int
