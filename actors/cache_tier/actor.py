"""The cache_tier actor: the disk tier of the KV cache. It moves blocks between the host tier's
slots (the shared-memory segment the executor made, mapped here by name) and block-chain files on
disk (disk_store.py), as the scheduler asks (schemas/cache.py): spills of blocks the host must make
room for or that sessions keep, and fetches of a prompt's chain before its prefill.

Thin: requests run on worker threads, so the loop never waits on the disk, in two lanes, each in
the order the requests came: reads (fetches and listings) and writes (spills). A fetch, which a
prompt waits for, so never waits for a spill being written and synced (45-50 ms of an 8B model's
16 blocks); the disk never sees two writers from here. A flush waits for both lanes, and both
wait for it. The scheduler keeps a request's slots from any other use until the reply; a
restarted cache_tier announces itself by its heartbeat, and the scheduler frees what the last one
was moving.

Namespaces (one per state of the weights) are directories under `--disk-kv-dir`; the two most
recently used stay open and the files of an older one are deleted when a third comes (an RL run
makes a namespace per update: only the served weights' and the previous ones' blocks are worth
keeping). Every answer says what the disk holds in the namespace asked about (`DiskFigures`); an
admin's flush (`FlushDisk`) deletes the block files of every namespace, after the requests before
it and before those after it. With `--disk-kv-gb 0` every request is answered with an Error.

With the sessions in an external NATS's JetStream, the chains are shared with servers on other
machines through an object bucket (shared_chains.py), in a third lane that no request waits for
(bucket_lane.py): each chain file a spill of the checkpoint's own namespace wrote is put there after
the spill's answer; a listing lists the bucket again, names its blocks beside the disk's, and
queues the pull of the chains the disk lacks. A fetch reads the disk alone.
"""

import asyncio
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from actors.cache_tier.bucket_lane import BucketLane
from actors.cache_tier.disk_store import DiskStore, remove_chains
from actors.cache_tier.host_segment import HostSegment
from actors.cache_tier.shared_chains import open_shared_chains
from kernel.actor import Actor
from kernel.bus_jetstream import JetStreamError
from schemas.cache import (
    BlocksFetched,
    BlocksListed,
    BlocksSpilled,
    CacheTierReply,
    CacheTierRequest,
    DiskFigures,
    DiskFlushed,
    FetchBlocks,
    FlushDisk,
    ListBlocks,
    SpillBlocks,
)
from schemas.errors import Error

OPEN_NAMESPACES = 2
# A fetch's pieces read and checked at once: one thread reads and checks a page-cached chain at
# ~1-2 GB/s, and a restart's 16K-token prompt (2 GiB of llama-3.1-8b) waits for all of it.
READ_THREADS = 16
DEFAULT_DIR = "kv-blocks"
# The lanes a request runs in, each in arrival order (see above).
LANES = {FetchBlocks: ("reads",), ListBlocks: ("reads",), SpillBlocks: ("writes",), FlushDisk: ("reads", "writes")}
# A stop waits this long for the chains still queued for the shared bucket: within the supervisor's
# STOP_TIMEOUT_S; what is left is on the local disk, and out of the bucket.
PUT_DRAIN_S = 8.0
# Hashes per page of a listing: 16 bytes and msgpack's 2 each, some 300 KB, within the bus's 1 MB.
LIST_PAGE_BLOCKS = 16384


class CacheTierActor(Actor):
    """Spills host slots to the disk tier and fetches disk chains into host slots."""

    name = "cache_tier"

    async def start(self) -> None:
        engine = self.config.engine
        self.capacity_bytes = int(engine.disk_kv_gb * 1e9)
        self.root = Path(engine.disk_kv_dir or Path(self.config.supervision.data_dir) / DEFAULT_DIR)
        self.stores: OrderedDict[str, DiskStore] = OrderedDict()  # least recently used first
        self.segment: HostSegment | None = None
        self.readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="disk-tier-read")
        # Each lane's last request: the next in the lane starts once it is done.
        self._lane_ends: dict[str, asyncio.Future] = {}
        self._opening = threading.Lock()  # the two lanes' threads share the segment and the stores
        # Per namespace, the listing whose pages are being asked: its hashes, and the figures then.
        self._listings: dict[str, tuple[list[bytes], DiskFigures]] = {}
        shared = await open_shared_chains(self.config, self.bus, self.subjects.chains_bucket, self.capacity_bytes)
        self.bucket = BucketLane(shared, self.stores.get, self.capacity_bytes, self.log) if shared else None
        if self.bucket is not None:
            self.bucket.sweep_later()
        await self.bus.subscribe(self.subjects.cache_tier, CacheTierRequest, self._on_request)
        self.log.info("disk_tier", directory=str(self.root), capacity_bytes=self.capacity_bytes)

    async def stop(self) -> None:
        if self.bucket is not None:
            await self.bucket.drain(PUT_DRAIN_S)

    async def _on_request(self, message: CacheTierRequest, reply_to: str | None) -> Error | None:
        """Queues the request in its lanes, in the order requests come; its answer goes to
        `reply_to` when it has run."""
        if self.capacity_bytes <= 0:
            return Error("unavailable", "this server has no disk tier (--disk-kv-gb 0)")
        lanes = LANES[type(message)]
        before = [end for lane in lanes if (end := self._lane_ends.get(lane)) is not None]
        done = asyncio.get_running_loop().create_future()
        for lane in lanes:
            self._lane_ends[lane] = done
        serving = self.spawn(self._serve(message, reply_to, before, done), "disk_tier_request")
        if self.bucket is not None and isinstance(message, FetchBlocks):
            self.bucket.fetch_started()
            serving.add_done_callback(lambda _: self.bucket.fetch_done())  # served, failed or cancelled
        return None

    async def _serve(
        self, message: CacheTierRequest, reply_to: str | None, before: list[asyncio.Future], done: asyncio.Future
    ) -> None:
        try:
            for earlier in before:
                await earlier
            reply = await self._answer(message)
            # Queued before the next request of the lane runs: a flush after it drops them.
            if self.bucket is not None:
                self._queue_bucket_work(message, reply)
        finally:
            done.set_result(None)
        if reply_to:
            await self.bus.reply(reply_to, reply)

    def _queue_bucket_work(self, message: CacheTierRequest, reply: CacheTierReply) -> None:
        """The puts a spill's files make, the pulls a listing finds."""
        if isinstance(message, SpillBlocks) and isinstance(reply, BlocksSpilled) and message.lasting:
            self.bucket.queue_puts(message.namespace, reply.stored)
        elif isinstance(message, ListBlocks) and isinstance(reply, BlocksListed) and message.start == 0:
            self.bucket.queue_pulls(message.namespace)

    async def _answer(self, message: CacheTierRequest) -> CacheTierReply:
        try:
            if self.bucket is not None:
                await self._before_shared(message)
            if isinstance(message, ListBlocks):
                return await self._list_page(message)
            if isinstance(message, FlushDisk):
                self._listings.clear()
            return await asyncio.to_thread(self._handle, message)
        except (OSError, ValueError) as exc:  # a segment that is gone or not one: the request fails, the tier serves on
            self.log.warning("disk_tier_request_failed", request=type(message).__name__, error=str(exc))
            return Error("unavailable", f"the disk tier cannot serve this request: {exc}", retriable=True)
        except Exception as exc:  # as the bus answers a handler that raised: logged, and the tier serves on
            self.log.exception("disk_tier_request_raised", request=type(message).__name__)
            return Error("internal", f"{type(exc).__name__}: {exc}", retriable=True)

    async def _list_page(self, message: ListBlocks) -> CacheTierReply:
        """A page of the namespace's listing. The first page takes the listing whole (the disk's
        blocks and the bucket's) and it is kept until its last page is served: the pages are cut
        from one listing, so none skips a block when others come and go between pages (a block
        spilled since, the scheduler counts in itself; one dropped since costs a fetch that finds
        nothing)."""
        if message.start == 0:
            listed = await asyncio.to_thread(self._handle, message)
            hashes = listed.hashes
            if self.bucket is not None:
                hashes = list(dict.fromkeys(hashes + self.bucket.shared.hashes(message.namespace)))
            self._listings[message.namespace] = (hashes, listed.figures)
        elif message.namespace not in self._listings:  # a flush or a restart came between the pages
            return Error(
                "unavailable", "no listing of this namespace is under way: list from the start", retriable=True
            )
        hashes, figures = self._listings[message.namespace]
        page = page_of(hashes, message.start, figures)
        if page.next_start is None:
            del self._listings[message.namespace]
        return page

    async def _before_shared(self, message: CacheTierRequest) -> None:
        """What the shared bucket adds to a request: a listing lists the bucket again, a flush
        empties it. A bucket that fails leaves the request to the local disk."""
        try:
            match message:
                case ListBlocks(start=0):  # a listing's first page: the bucket as it is now
                    await self.bucket.shared.refresh()
                case FlushDisk():
                    await self.bucket.halt()
                    await self.bucket.shared.clear()
        except JetStreamError as exc:
            self.log.warning("kv_chains_bucket_failed", request=type(message).__name__, error=str(exc))

    def _open(self, message: SpillBlocks | FetchBlocks | ListBlocks):
        """The host segment's slots and the namespace's store, for a request."""
        with self._opening:
            slots = self._slots(message.segment)
            return slots, self._store(message.namespace, slots.shape[1])

    def _handle(self, message: CacheTierRequest) -> CacheTierReply:
        if isinstance(message, FlushDisk):  # every namespace's: no segment, no one store
            return self._flush()
        slots, store = self._open(message)
        match message:
            case SpillBlocks(slots=taken, hashes=hashes, parents=parents, token_ids=tokens):
                block_size = len(tokens) // len(hashes) if hashes else 0
                stored = []
                for start, stop in chain_runs(hashes, parents):  # one file (one fsync) per run
                    run = hashes[start:stop]
                    blocks = [memoryview(slots[slot]) for slot in taken[start:stop]]
                    store.put(run, tokens[start * block_size : stop * block_size], blocks, parents[start])
                    stored += [h for h in run if store.holds(h)]
                return BlocksSpilled(stored, self._figures(store))
            case FetchBlocks(slots=taken, hashes=hashes):
                on_disk = store.longest_prefix(hashes)
                out = [memoryview(slots[slot]) for slot in taken[:on_disk]]
                read = store.read(hashes[:on_disk], out, self.readers) if on_disk else 0
                return BlocksFetched(read, self._figures(store))
            case ListBlocks():
                return BlocksListed(store.hashes(), self._figures(store))

    def _flush(self) -> DiskFlushed:
        """Deletes the chain files under the tier's directory, then forgets the open namespaces' blocks."""
        files = remove_chains(self.root)
        with self._opening:
            blocks = sum(store.clear() for store in self.stores.values())
        self.log.info("disk_tier_flushed", files=files, blocks=blocks)
        return DiskFlushed(blocks, files)

    def _figures(self, store: DiskStore) -> DiskFigures:
        stats = store.stats()
        return DiskFigures(stats.blocks, stats.bytes, self.capacity_bytes)

    def _slots(self, name: str):
        """The host segment's slots, uint8 [num_slots, slot_bytes]; mapped again if the executor
        made another (a restarted one with another geometry)."""
        if self.segment is None or self.segment.name != name:
            if self.segment is not None:
                self.segment.close()
            self.segment = HostSegment.attach(name)
            threading.Thread(target=self._prefault, args=(self.segment,), name="host-prefault", daemon=True).start()
        return self.segment.slots()

    def _prefault(self, segment: HostSegment) -> None:
        """Maps the segment's pages now, on the reader threads, so a fetch asked meanwhile reads
        after it (the pieces are queued first): a restart's first fetch then reads at the rate of
        the reads alone, not of the page faults (HostSegment.prefault). On an H200 host, a 24 GiB
        segment mapped this way took the restart's TTFT from 0.47-0.53 to 0.385 of a recompute (one run)."""
        started = time.monotonic()
        try:
            segment.prefault(self.readers)
        except (OSError, ValueError) as exc:  # an old kernel, or the segment replaced meanwhile: faults, as before
            self.log.warning("host_segment_not_prefaulted", segment=segment.name, error=str(exc))
            return
        self.log.info("host_segment_prefaulted", segment=segment.name, seconds=round(time.monotonic() - started, 3))

    def _store(self, namespace: str, block_bytes: int) -> DiskStore:
        store = self.stores.get(namespace)
        if store is None or store.block_bytes != block_bytes:
            store = DiskStore(self.root, namespace, block_bytes, self.capacity_bytes)
            self.stores[namespace] = store
            if len(self.stores) > OPEN_NAMESPACES:
                old_namespace, old = self.stores.popitem(last=False)
                self.log.info("disk_tier_namespace_dropped", namespace=old_namespace, blocks=old.clear())
        self.stores.move_to_end(namespace)
        return store


def page_of(hashes: list[bytes], start: int, figures: DiskFigures) -> BlocksListed:
    """The page of a listing of `hashes` from its `start`th, LIST_PAGE_BLOCKS long at most."""
    stop = start + LIST_PAGE_BLOCKS
    return BlocksListed(hashes[start:stop], figures, stop if stop < len(hashes) else None)


def chain_runs(hashes: list[bytes], parents: list[bytes]) -> list[tuple[int, int]]:
    """[start, stop) of each run of blocks that follow one another (each block's parent the hash
    before it): the blocks of one prompt, spilled in order, go to disk as one chain file."""
    runs: list[tuple[int, int]] = []
    for i, parent in enumerate(parents):
        if runs and i and parent == hashes[i - 1]:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs
