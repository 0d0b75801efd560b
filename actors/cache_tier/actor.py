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
machines through an object bucket (shared_chains.py), in a third lane that no request waits for:
each chain file a spill of the checkpoint's own namespace wrote is put there after the spill's
answer; a listing lists the bucket again, names its blocks beside the disk's, and queues the pull
of the chains the disk lacks (after any puts queued). A fetch reads the disk alone. A stop drops
the pulls and makes the puts still queued for at most PUT_DRAIN_S.
"""

import asyncio
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from actors.cache_tier.disk_store import DiskStore, remove_chains
from actors.cache_tier.host_segment import HostSegment
from actors.cache_tier.shared_chains import SharedChains, open_shared_chains
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
MAX_QUEUED_PUTS = 1024  # chain files; past it a spill's files stay local only


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
        self.shared: SharedChains | None = await open_shared_chains(
            self.config, self.bus, self.subjects.chains_bucket, self.capacity_bytes
        )
        # The bucket lane's work, puts first: (KV namespace, chain file, its hashes) and
        # (KV namespace, object name, its bytes, its hashes); the names of the objects queued for a pull.
        self._puts: deque[tuple[str, Path, list[bytes]]] = deque()
        self._pulls: deque[tuple[str, str, int, list[bytes]]] = deque()
        self._pulling: set[str] = set()
        self._bucket_lane: asyncio.Task | None = None
        await self.bus.subscribe(self.subjects.cache_tier, CacheTierRequest, self._on_request)
        self.log.info("disk_tier", directory=str(self.root), capacity_bytes=self.capacity_bytes)

    async def stop(self) -> None:
        self._pulls.clear()
        self._pulling.clear()
        if self._bucket_lane is None or self._bucket_lane.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._bucket_lane), PUT_DRAIN_S)
        except TimeoutError:
            self.log.warning("kv_chains_not_all_shared", left=len(self._puts))
            self._bucket_lane.cancel()
        except Exception:  # the lane's own failure: logged, and the stop goes on
            self.log.exception("kv_chains_lane_failed")

    async def _stop_bucket_lane(self) -> None:
        """Before a flush: nothing queued is moved, and what is moving now lands before the flush
        deletes (an object half put, a file half pulled, would outlive it)."""
        self._puts.clear()
        self._pulls.clear()
        self._pulling.clear()
        if self._bucket_lane is not None and not self._bucket_lane.done():
            await asyncio.gather(self._bucket_lane, return_exceptions=True)

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
        self.spawn(self._serve(message, reply_to, before, done), "disk_tier_request")
        return None

    async def _serve(
        self, message: CacheTierRequest, reply_to: str | None, before: list[asyncio.Future], done: asyncio.Future
    ) -> None:
        try:
            for earlier in before:
                await earlier
            reply = await self._answer(message)
            # Queued before the next request of the lane runs: a flush after it drops them.
            if isinstance(message, SpillBlocks) and isinstance(reply, BlocksSpilled) and message.lasting:
                self._queue_puts(message.namespace, reply.stored)
            elif isinstance(message, ListBlocks) and isinstance(reply, BlocksListed):
                self._queue_pulls(message.namespace)
        finally:
            done.set_result(None)
        if reply_to:
            await self.bus.reply(reply_to, reply)

    async def _answer(self, message: CacheTierRequest) -> CacheTierReply:
        try:
            if self.shared is not None:
                await self._before_shared(message)
            reply = await asyncio.to_thread(self._handle, message)
            if self.shared is not None and isinstance(message, ListBlocks) and isinstance(reply, BlocksListed):
                both = dict.fromkeys(reply.hashes + self.shared.hashes(message.namespace))
                reply = BlocksListed(list(both), reply.figures)
            return reply
        except (OSError, ValueError) as exc:  # a segment that is gone or not one: the request fails, the tier serves on
            self.log.warning("disk_tier_request_failed", request=type(message).__name__, error=str(exc))
            return Error("unavailable", f"the disk tier cannot serve this request: {exc}", retriable=True)
        except Exception as exc:  # as the bus answers a handler that raised: logged, and the tier serves on
            self.log.exception("disk_tier_request_raised", request=type(message).__name__)
            return Error("internal", f"{type(exc).__name__}: {exc}", retriable=True)

    async def _before_shared(self, message: CacheTierRequest) -> None:
        """What the shared bucket adds to a request: a listing lists the bucket again, a flush
        empties it. A bucket that fails leaves the request to the local disk."""
        try:
            match message:
                case ListBlocks():
                    await self.shared.refresh()
                case FlushDisk():
                    await self._stop_bucket_lane()
                    await self.shared.clear()
        except JetStreamError as exc:
            self.log.warning("kv_chains_bucket_failed", request=type(message).__name__, error=str(exc))

    def _queue_puts(self, namespace: str, stored: list[bytes]) -> None:
        """Queues the chain files holding the blocks a spill stored, for the bucket."""
        store = self.stores.get(namespace)
        if self.shared is None or store is None or not stored:
            return
        for name, hashes in store.files_of(stored).items():
            if self.shared.holds_file(namespace, name):
                continue
            if len(self._puts) >= MAX_QUEUED_PUTS:
                self.log.warning("kv_chains_put_queue_full", queued=len(self._puts))
                break
            self._puts.append((namespace, store.directory / name, hashes))
        self._run_bucket_lane()

    def _queue_pulls(self, namespace: str) -> None:
        """Queues the bucket's chains of the namespace that the disk lacks, latest put first, as
        many as the disk has room for."""
        store = self.stores.get(namespace)
        if self.shared is None or store is None:
            return
        room = self.capacity_bytes - store.stats().bytes
        for name, size, hashes in self.shared.newest_first(namespace):
            if name in self._pulling or store.held_prefix(hashes) == len(hashes):
                continue
            if size > room:
                break
            room -= size
            self._pulls.append((namespace, name, size, hashes))
            self._pulling.add(name)
        self._run_bucket_lane()

    def _run_bucket_lane(self) -> None:
        if (self._puts or self._pulls) and (self._bucket_lane is None or self._bucket_lane.done()):
            # Not `spawn`: a stop cancels spawned tasks first, and lets this one finish its puts.
            self._bucket_lane = asyncio.create_task(self._bucket_work(), name="kv_chains_bucket")

    async def _bucket_work(self) -> None:
        """Puts, then pulls, until both queues are empty; logs what moved (`kv_chains_put`,
        `kv_chains_pulled`: chains, bytes and the seconds the lane took)."""
        moved = {"put": [0, 0], "pulled": [0, 0]}  # chains, bytes
        started = time.monotonic()
        while self._puts or self._pulls:
            if self._puts:
                namespace, path, hashes = self._puts.popleft()
                if (size := await self._put(namespace, path, hashes)) is not None:
                    moved["put"] = [moved["put"][0] + 1, moved["put"][1] + size]
                continue
            namespace, name, size, hashes = self._pulls.popleft()
            self._pulling.discard(name)
            if await self._pull(namespace, name, hashes):
                moved["pulled"] = [moved["pulled"][0] + 1, moved["pulled"][1] + size]
        seconds = round(time.monotonic() - started, 3)
        for what, (chains, size) in moved.items():
            if chains:
                self.log.info(f"kv_chains_{what}", chains=chains, bytes=size, seconds=seconds)

    async def _put(self, namespace: str, path: Path, hashes: list[bytes]) -> int | None:
        """Puts one chain file in the bucket; its size, or None if it was not put now."""
        try:
            return await self.shared.put(namespace, path, hashes)
        except (JetStreamError, OSError) as exc:  # JetStream away or full, the file unreadable: it stays local
            self.log.warning("kv_chain_not_shared", file=path.name, error=str(exc))
            return None

    async def _pull(self, namespace: str, name: str, hashes: list[bytes]) -> bool:
        """Brings one chain from the bucket into the disk, unless the disk has it by now."""
        store = self.stores.get(namespace)
        if store is None or store.held_prefix(hashes) == len(hashes):
            return False
        try:
            temp = await self.shared.get(name, store.directory)
            return await asyncio.to_thread(store.adopt, temp)
        except (JetStreamError, OSError) as exc:  # the object gone or damaged, JetStream away: recomputed
            self.log.warning("kv_chain_not_pulled", object=name, error=str(exc))
            return False

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
        return self.segment.slots()

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
