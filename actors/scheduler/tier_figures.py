"""The KV cache's tiers as GET /admin/cache and /metrics show them (schemas/admin.py:TierFigures):
what each holds now, and which tier served the blocks of requests' prefixes.

Hits and lookups count whole blocks at a request's first lookup (a readmission counts nothing): the
GPU's prefix cache is asked for every whole block the request may read, the host tier for the blocks
after the GPU's, the disk tier for those after the host's. A block that the disk tier read back into
the host for this request (`Sequence.disk_blocks`) is the disk's hit, though it reaches the GPU
through a host slot: such blocks end the prefix, after the host's own.
"""

from schemas.admin import TierFigures, TierName


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
