"""The scheduler's admin conversations (`<ns>.admin.*`, schemas/admin.py) and the commit of new
weights that weight_sync announces: a plain object the scheduler actor asks once an executor is
known. It acts on the batcher, the session table, the pause of generation and, for a flush of the
disk tier, the cache_tier (disk_link.py); the actor sends what follows (the ends of aborted
requests, the batcher's next round) and the replies.
"""

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from actors.scheduler.batching import ContinuousBatcher
from actors.scheduler.pause import GenerationPause
from actors.scheduler.sequence import Sequence
from actors.scheduler.sessions import SessionTable
from actors.scheduler.tier_figures import cache_report, tier_figures
from kernel.subjects import Subjects
from schemas.admin import (
    AdminReply,
    AdminRequest,
    CacheFlushed,
    ContinueGeneration,
    FlushCache,
    FlushTier,
    GetCache,
    GetPause,
    GetStats,
    PauseGeneration,
    PauseState,
    PublishPrefix,
    SchedulerStats,
    TierName,
)
from schemas.errors import Error
from schemas.scheduler_weights import CacheGeneration, WeightsCommitted


def admin_subjects(subjects: Subjects) -> list[tuple[str, type[AdminRequest]]]:
    """Each conversation's subject, with the kind of message it carries."""
    return [
        (subjects.admin_stats, GetStats),
        (subjects.admin_flush_cache, FlushCache),
        (subjects.admin_cache, GetCache),
        (subjects.admin_publish, PublishPrefix),
        (subjects.admin_pause, PauseGeneration),
        (subjects.admin_continue, ContinueGeneration),
        (subjects.admin_pause_state, GetPause),
    ]


def scheduler_stats(batcher: ContinuousBatcher) -> SchedulerStats:
    """The batcher's figures, as GET /admin/stats shows them before the pause adds its own."""
    kv = batcher.kv
    cache, tiers = kv.cache.stats(), tier_figures(kv)
    return SchedulerStats(
        len(batcher.requests.waiting),
        len(batcher.requests.running),
        kv.pool.num_blocks,
        kv.pool.num_free,
        cache.cached_blocks,
        cache.evictable_blocks,
        cache.hit_tokens,
        cache.queried_tokens,
        batcher.preemptions,
        tiers,
        sum(tiers[t].hits for t in ("host", "disk") if t in tiers) * kv.block_size,
    )


class PauseChanged(NamedTuple):
    """A pause or a continue took effect. The actor ends `aborted` for their origins (keeping their
    output), sends the batcher's next round, then answers `SchedulerAdmin.pause_state()` as that
    round left it."""

    aborted: list[Sequence]


class SchedulerAdmin:
    """Answers the admin conversations over the batcher and the sessions of the actor that owns
    them (both live as long as the actor: a new executor resets them in place). Owns the pause."""

    def __init__(
        self,
        batcher: ContinuousBatcher,
        sessions: SessionTable,
        flush_disk: Callable[[], Awaitable[int | Error]],
        log,
    ) -> None:
        self.batcher = batcher
        self.sessions = sessions
        self.flush_disk = flush_disk  # the cache_tier deletes its files: the blocks it forgot (disk_link.py)
        self.pause = GenerationPause()
        self.log = log

    def answer(self, message: AdminRequest) -> AdminReply | Error | PauseChanged:
        """Stats, the prefix cache, and the pause of generation (actors/scheduler/pause.py); a flush
        is `flush`'s, which may wait for the disk tier."""
        batcher = self.batcher
        match message:
            case GetStats():
                return self.pause.stats(scheduler_stats(batcher))
            case GetCache():
                return cache_report(batcher.kv, batcher.requests.running)
            case FlushCache():
                raise ValueError("a flush is answered by SchedulerAdmin.flush")
            case PublishPrefix(input_ids):
                published = batcher.kv.publish(input_ids)
                self.log.info("prefix_published", tokens=published.tokens, opened_blocks=published.opened_blocks)
                return published
            case PauseGeneration(mode):
                aborted = self.pause.pause(batcher, mode)
                self.log.info("generation_paused", mode=mode, aborted=len(aborted))
                return PauseChanged(aborted)
            case ContinueGeneration():
                if error := self.pause.resume(batcher):
                    return error
                self.log.info("generation_continued")
                return PauseChanged([])
            case GetPause():
                return self.pause_state()

    async def flush(self, tier: FlushTier) -> CacheFlushed | Error:
        """Empties `tier` (or every tier): the GPU's and the host's at once, then the disk's once the
        cache_tier has done what was asked of it before. So after "all" no block of the host is
        written to disk again; requests that run on cache their blocks afresh. A request whose
        blocks go meanwhile computes them again, as after an eviction."""
        kv = self.batcher.kv
        freed: dict[TierName, int] = {}
        if tier in ("gpu", "all"):
            self.sessions.unpin_all()  # their KV is cached like any other: stale, if the weights changed
            freed["gpu"] = kv.flush()
        if tier in ("host", "all") and kv.host is not None:
            freed["host"] = kv.flush_host()
        if tier in ("disk", "all") and kv.disk is not None:
            disk = await self.flush_disk()
            if isinstance(disk, Error):
                return disk
            freed["disk"] = disk
        self.log.info("cache_flushed", tier=tier, **{f"{name}_blocks": n for name, n in freed.items()})
        return CacheFlushed(sum(freed.values()), freed)

    def pause_state(self) -> PauseState:
        return self.pause.state(self.batcher)

    def weights_committed(self, message: WeightsCommitted) -> CacheGeneration:
        """The executor serves new weights (weight_sync tells, before generation resumes): unless the
        update keeps the cache, the prefix cache starts a new generation, so no KV computed under
        the old weights is read again; sessions' pins go with it, the sessions stay open."""
        freed = 0
        if not message.keep_cache:
            self.sessions.unpin_all()
            freed = self.batcher.kv.new_generation()
        generation = self.batcher.kv.cache.generation
        self.log.info(
            "weights_committed",
            version=message.version,
            keep_cache=message.keep_cache,
            generation=generation,
            freed_blocks=freed,
        )
        return CacheGeneration(generation, freed)
