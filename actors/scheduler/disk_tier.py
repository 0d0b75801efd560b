"""The scheduler's side of the disk tier (the cache_tier actor; schemas/cache.py): what it asks
and what it does with the answers, bus-free. The actor sends `take_requests()` and hands each reply
to `replied`.

- Spills: every block the host tier indexes is written to disk too, oldest first, one request at a
  time of up to SPILL_BATCH blocks; the host tier evicts a block only once the disk tier had it.
  So what leaves the host is on disk, and a session's blocks are there when the server restarts.
  The disk tier reads beside a spill being written (actors/cache_tier/actor.py's lanes), but the
  spill's writes, checks and syncs would share the disk and the host's cores with the reads of a
  fetch, which a prompt waits for: while fetches wait no spill is sent (for at most SPILL_HOLD_S:
  a steady flow of fetches must not keep the host's blocks off the disk for ever).
- Fetches: a waiting request whose prefix continues past what the GPU and the host hold asks the
  disk tier for the rest, once, before its admission, in pieces of FETCH_PIECE_BLOCKS read one
  after the other into reserved host slots. Each piece that lands is loaded into the GPU's tree at
  the next scheduling round that reaches the request (KVManager's prefetch), while the next piece
  is read, and the admission loads the last as any host hit: only the last piece's copy to the GPU
  stands between the disk and the first token. The request waits for every piece, not longer than
  FETCH_DEADLINE_S (then it goes on with the shorter hit), and no longer once a piece comes back
  short; others are admitted meanwhile.
- What the disk holds: listed once per namespace (ListBlocks, in pages), then followed by what each spill
  stored, so a prompt the disk cannot continue (a new one) is admitted at once, not after a fetch
  that waits behind the disk tier's writes. Until a namespace is listed every prompt asks; a block
  the disk dropped since (its size cap) costs a fetch that finds nothing.
- Figures: what the disk holds in each namespace, as its last answer about it said.
- Flushes: an admin's (FlushDisk) empties the disk and the list; the host's blocks that the disk
  has had are not written again.
"""

import time
from dataclasses import dataclass
from itertools import takewhile

from actors.scheduler.host_tier import HostTier
from actors.scheduler.radix_cache import RadixCache
from actors.scheduler.sequence import Sequence
from schemas.cache import (
    BlocksFetched,
    BlocksListed,
    BlocksSpilled,
    CacheTierReply,
    CacheTierRequest,
    DiskFigures,
    FetchBlocks,
    ListBlocks,
    Namespace,
    SpillBlocks,
)
from schemas.errors import Error

SPILL_BATCH = 16  # blocks per spill request (of an 8B model's blocks: 32 MiB)
SPILL_HOLD_S = 0.5  # the longest spills wait for fetches
MAX_FETCH = 1024  # blocks a request fetches
# Blocks per fetch piece: small enough that the copies of the pieces before the last overlap the
# reading of the later ones, large enough that each keeps the disk tier's reader threads busy (an
# 8B model's 256 blocks are 512 MiB, 32 tasks of READ_PIECE_BLOCKS).
FETCH_PIECE_BLOCKS = 256
FETCH_DEADLINE_S = 2.0  # a request waits no longer for its fetch
ANSWER_TIMEOUT_S = 60.0  # the disk tier's answer to any request
LIST_RETRY_S = 1.0  # a listing that failed (the disk tier not up yet) is asked again after this


@dataclass
class PendingFetch:
    seq: Sequence
    pieces: int  # pieces not answered yet


class DiskTier:
    """Owns the disk tier's moves of `host`'s slots and the requests that wait for a fetch."""

    def __init__(self, host: HostTier, cache: RadixCache, segment: str) -> None:
        self.host = host
        self.cache = cache
        self.segment = segment
        self._fetches: dict[str, PendingFetch] = {}  # request id -> its fetch in flight
        self._requests: list[tuple[str | None, CacheTierRequest]] = []
        self._spilling = False
        self._spills_held_since: float | None = None  # when waiting fetches began to hold the spills
        self._on_disk: dict[Namespace, set[bytes]] = {}  # the blocks the disk holds, once listed
        # A listing under way: the next page's start, and the blocks of the pages so far.
        self._listing: dict[Namespace, tuple[int, set[bytes]]] = {}
        self._list_after: dict[Namespace, float] = {}  # listings asked (or failed): when to ask again
        self._figures: dict[Namespace, DiskFigures] = {}  # as the disk tier last answered

    def waits(self, seq: Sequence, lookup: list[int]) -> bool:
        """Whether `seq` waits for a fetch from disk (started now, the first time it is asked, if
        the disk may hold more of `lookup`, its matchable tokens, than the GPU and the host)."""
        if seq.fetching or seq.disk_looked_up:
            return seq.fetching
        seq.disk_looked_up = True
        whole = (len(lookup) - 1) // self.host.block_size  # a match never covers the last token
        on_gpu = len(self.cache.match(lookup, seq.tenant).blocks)
        hashes = self.host.hashes(seq, lookup, whole)
        on_host = len(self.host.match(hashes[on_gpu:]))
        rest = hashes[on_gpu + on_host :][:MAX_FETCH]
        if (listed := self._on_disk.get(self.host.key)) is not None:
            rest = list(takewhile(listed.__contains__, rest))
        slots = self.host.reserve(len(rest)) if rest else []
        if not slots:
            return False
        rest = rest[: len(slots)]
        starts = range(0, len(slots), FETCH_PIECE_BLOCKS)
        for start in starts:
            piece = slice(start, start + FETCH_PIECE_BLOCKS)
            self._requests.append((seq.request_id, FetchBlocks(self.segment, self.host.key, slots[piece], rest[piece])))
        self._fetches[seq.request_id] = PendingFetch(seq, len(starts))
        seq.fetching = True
        seq.gpu_blocks_at_fetch = on_gpu
        return True

    def take_requests(self) -> list[tuple[str | None, CacheTierRequest]]:
        """The requests to send now, each with the request id it is for (None: a spill or a listing)."""
        key = self.host.key
        if key not in self._on_disk and self._list_after.get(key, 0.0) <= time.monotonic():
            self._list_after[key] = float("inf")  # asked: not again unless it fails
            self._requests.append((None, ListBlocks(self.segment, key)))
        if not self._spilling and self._may_spill() and (spills := self.host.take_spill(SPILL_BATCH)):
            self._spilling = True
            tokens = [t for spill in spills for t in spill.token_ids]
            request = SpillBlocks(
                self.segment,
                self.host.key,
                [s.slot for s in spills],
                [s.block_hash for s in spills],
                [s.parent for s in spills],
                tokens,
                lasting=self.host.lasting,
            )
            self._requests.append((None, request))
        requests, self._requests = self._requests, []
        return requests

    def _may_spill(self) -> bool:
        """No fetch waits, or they have held the spills SPILL_HOLD_S already."""
        if not self._fetches:
            self._spills_held_since = None
            return True
        now = time.monotonic()
        if self._spills_held_since is None:
            self._spills_held_since = now
        return now - self._spills_held_since >= SPILL_HOLD_S

    def replied(self, request_id: str | None, request: CacheTierRequest, reply: CacheTierReply) -> None:
        """The disk tier's answer. An Error of its own: nothing was stored or read. No answer in
        time: it may still be moving the slots, which stay out of use until it answers or restarts."""
        unanswered = isinstance(reply, Error) and reply.code == "timeout"
        if isinstance(reply, BlocksSpilled | BlocksFetched | BlocksListed) and reply.figures is not None:
            self._figures[request.namespace] = reply.figures
        match request:
            case SpillBlocks(slots=slots, namespace=key):
                self._spilling = False
                if not unanswered:
                    self.host.spilled(slots)
                if isinstance(reply, BlocksSpilled):
                    for known in (self._on_disk.get(key), self._listing.get(key, (0, None))[1]):
                        if known is not None:
                            known.update(reply.stored)
            case FetchBlocks(segment=segment, slots=slots, hashes=hashes, namespace=key):
                if not unanswered:
                    # Read into another executor's segment (one of another geometry): not these slots.
                    ours = isinstance(reply, BlocksFetched) and segment == self.segment
                    count = reply.count if ours else 0
                    indexed = self.host.fetched(slots, hashes, count, key)
                    if (pending := self._fetches.get(request_id or "")) is not None:
                        pending.seq.disk_blocks += indexed  # the disk's hits, once loaded
                        pending.seq.piece_landed = indexed > 0  # to the GPU at its next round (KVManager)
                        pending.pieces -= 1
                    if ours and count < len(hashes):  # gone from the disk, or failed its check
                        self._on_disk.get(key, set()).discard(hashes[count])
                    if pending is not None and pending.pieces and count == len(hashes):
                        return  # whole: the request waits for its next piece
                self.deadline_passed(request_id)
            case ListBlocks(namespace=key, start=start):
                under_way = self._listing.pop(key, None)
                if start and (under_way is None or under_way[0] != start):
                    return  # a page of a listing given up since (a flush, a new cache_tier)
                listed = under_way[1] if start else set()
                if not isinstance(reply, BlocksListed):
                    self._list_after[key] = time.monotonic() + LIST_RETRY_S  # from its first page
                elif reply.next_start is None:
                    self._on_disk[key] = listed | set(reply.hashes)
                else:
                    self._listing[key] = (reply.next_start, listed | set(reply.hashes))
                    self._requests.append((None, ListBlocks(self.segment, key, reply.next_start)))

    def figures(self) -> DiskFigures | None:
        """What the disk holds in the served namespace, as it last said; None before it has."""
        return self._figures.get(self.host.key)

    def flushed(self) -> None:
        """The disk tier deleted every block: none is listed, and every namespace is listed again."""
        self._on_disk.clear()
        self._listing.clear()
        self._list_after.clear()
        self._figures = {key: DiskFigures(0, 0, f.capacity_bytes) for key, f in self._figures.items()}

    def deadline_passed(self, request_id: str | None) -> bool:
        """`request_id` stops waiting for its fetch (answered, or too late: a shorter hit); returns
        whether it was waiting."""
        pending = self._fetches.pop(request_id, None) if request_id else None
        if pending is not None:
            pending.seq.fetching = False
        return pending is not None

    def carry_over(self, old: "DiskTier") -> None:
        """Takes over the moves `old` (of an executor before) has under way, so that their slots
        stay out of use until the disk tier answers, and the requests waiting for them wait on."""
        self.host.adopt_in_flight(old.host)
        self._fetches, self._spilling = old._fetches, old._spilling
        for pending in self._fetches.values():  # what they prefetched went with the old pool
            pending.seq.prefetched = pending.seq.gpu_blocks_at_fetch = 0
        self._on_disk, self._list_after, self._figures = old._on_disk, old._list_after, old._figures
        for key in old._listing:  # its next page was in the old books' queue: listed again, whole
            self._list_after.pop(key, None)

    def restarted(self) -> None:
        """A new cache_tier: the old one's moves are void (their slots freed or spilled again)."""
        self.host.disk_tier_restarted()
        self._spilling = False
        self._on_disk.clear()  # listed again: the new one checked its files at start
        self._listing.clear()
        self._list_after.clear()
        for request_id in list(self._fetches):
            self.deadline_passed(request_id)
