"""The KV cache's tiers as GET /admin/cache and /metrics show them (schemas/admin.py:TierFigures):
what each holds now, and which tier served the blocks of requests' prefixes.

Hits and lookups count whole blocks at a request's first lookup (a readmission counts nothing): the
GPU's prefix cache is asked for every whole block the request may read, the host tier for the blocks
after the GPU's, the disk tier for those after the host's. A block that the disk tier read back into
the host for this request (`Sequence.disk_blocks`) is the disk's hit, though it reaches the GPU
through a host slot: such blocks end the prefix, after the host's own.

`cache_report` and `tier_figures` read them off the scheduler's KV manager (kv_manager.py).
"""

from typing import TYPE_CHECKING

from schemas.admin import CacheReport, TierFigures, TierName
from schemas.cache import DiskFigures

if TYPE_CHECKING:
    from actors.scheduler.kv_manager import KVManager
    from actors.scheduler.sequence import Sequence


class TierCounts:
    """Each tier's hits and lookups, in blocks, since the scheduler started (a new executor's
    books take them over, so /metrics' counters never go back)."""

    def __init__(self) -> None:
        self.hits: dict[TierName, int] = {"gpu": 0, "host": 0, "disk": 0}
        self.lookups: dict[TierName, int] = {"gpu": 0, "host": 0, "disk": 0}

    def record(self, sought: int, served: list[tuple[TierName, int]]) -> None:
        """A first lookup of `sought` blocks, of which the tiers of `served`, in order, served so many."""
        for tier, hits in served:
            self.lookups[tier] += sought
            self.hits[tier] += hits
            sought -= hits

    def figures(self, tier: TierName, held: tuple[int, int], capacity: tuple[int, int], pending: int) -> TierFigures:
        """`tier`'s figures: the blocks and bytes it holds, those it has room for, those on their way in."""
        hits, lookups = self.hits[tier], self.lookups[tier]
        hit_rate = hits / lookups if lookups else 0.0
        return TierFigures(*held, *capacity, hits, lookups, hit_rate, pending)


def cache_report(kv: "KVManager", running: "list[Sequence]") -> CacheReport:
    """GET /admin/cache: a walk of the tree, for people, not for the hot loop."""
    usage = kv.cache.usage()
    in_use = len({b for seq in running for b in seq.blocks})
    hit_rate = usage.hit_tokens / usage.queried_tokens if usage.queried_tokens else 0.0
    return CacheReport(
        kv.pool.num_blocks,
        usage.free_blocks,
        usage.cached_blocks,
        usage.evictable_blocks,
        in_use,
        usage.public_blocks,
        usage.private_blocks,
        usage.hit_tokens,
        usage.queried_tokens,
        hit_rate,
        tier_figures(kv),
    )


def tier_figures(kv: "KVManager") -> dict[TierName, TierFigures]:
    """What each tier this server has holds now and has served; no walk of the tree. The disk
    tier's blocks and bytes are as it last said (disk_tier.py)."""
    counts, bb = kv.counts, kv.block_bytes
    cached, total = kv.cache.stats().cached_blocks, kv.pool.num_blocks
    tiers = {"gpu": counts.figures("gpu", (cached, cached * bb), (total, total * bb), 0)}
    if kv.host is not None:
        host = kv.host.stats()
        held, room = (host.blocks, host.blocks * bb), (host.slots, host.slots * bb)
        tiers["host"] = counts.figures("host", held, room, host.pending)
    if kv.disk is not None:
        disk = kv.disk.figures() or DiskFigures(0, 0, 0)
        room = (disk.capacity_bytes // bb if bb else 0, disk.capacity_bytes)
        tiers["disk"] = counts.figures("disk", (disk.blocks, disk.bytes), room, kv.host.unspilled)
    return tiers
