"""The cache_tier's third lane: moving chain files between the local disk and the object bucket
that servers on other machines share (shared_chains.py), in the background; no request waits for it.

- Puts: each chain file a spill of the checkpoint's own namespace wrote goes into the bucket.
- Pulls: after a listing, the bucket's chains the disk lacks come into the disk, latest put first,
  as many as the disk has room for.
- Puts first, then pulls, one file at a time. Each waits while a fetch is being read (at most
  HOLD_S): a fetch is a prompt waiting for its blocks, and a put's or pull's chunks share the
  host's cores and the process's GIL with the reader threads (a restart's prompt read 0.53-0.63x
  of a recompute beside them, docs/journal/2026-11-27-restart-reads.md).
- After a start, first of all, the chunks of puts that a kill cut short are swept out.
- A flush (`halt`) drops what is queued and lets what is moving land; a stop (`drain`) drops the
  pulls and gives the puts still queued at most a deadline.
"""

import asyncio
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from actors.cache_tier.disk_store import DiskStore
from actors.cache_tier.shared_chains import SharedChains
from kernel.bus_jetstream import JetStreamError

MAX_QUEUED_PUTS = 1024  # chain files; past it a spill's files stay local only
HOLD_S = 0.5  # the longest a put or pull waits for the fetches being read


class BucketLane:
    """Queues and runs the puts and pulls of chain files between `stores` and `shared`."""

    def __init__(
        self, shared: SharedChains, stores: Callable[[str], DiskStore | None], capacity_bytes: int, log
    ) -> None:
        self.shared = shared
        self._store = stores  # a namespace's open store, if any
        self.capacity_bytes = capacity_bytes
        self.log = log
        self._puts: deque[tuple[str, Path, list[bytes]]] = deque()  # (namespace, chain file, its hashes)
        self._pulls: deque[tuple[str, str, int, list[bytes]]] = deque()  # (namespace, object, bytes, hashes)
        self._pulling: set[str] = set()  # the objects queued for a pull
        self._task: asyncio.Task | None = None
        self._sweep = False  # the chunks of puts a kill cut short: swept first, once asked
        self._fetches = 0  # being read, or queued to be
        self._no_fetches = asyncio.Event()
        self._no_fetches.set()

    def fetch_started(self) -> None:
        self._fetches += 1
        self._no_fetches.clear()

    def fetch_done(self) -> None:
        self._fetches -= 1
        if not self._fetches:
            self._no_fetches.set()

    def sweep_later(self) -> None:
        """Asks for the sweep of the chunks that puts a kill cut short (SharedChains.sweep_orphans),
        as the lane's first work: it reads every object's meta, which a start must not wait for."""
        self._sweep = True
        self._run()

    def queue_puts(self, namespace: str, stored: list[bytes]) -> None:
        """Queues the chain files holding the blocks a spill stored."""
        store = self._store(namespace)
        if store is None or not stored:
            return
        for name, hashes in store.files_of(stored).items():
            if self.shared.holds_file(namespace, name):
                continue
            if len(self._puts) >= MAX_QUEUED_PUTS:
                self.log.warning("kv_chains_put_queue_full", queued=len(self._puts))
                break
            self._puts.append((namespace, store.directory / name, hashes))
        self._run()

    def queue_pulls(self, namespace: str) -> None:
        """Queues the bucket's chains of the namespace that the disk lacks, latest put first, as
        many as the disk has room for."""
        store = self._store(namespace)
        if store is None:
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
        self._run()

    async def halt(self) -> None:
        """Before a flush: nothing queued is moved, and what is moving now lands before the flush
        deletes (an object half put, a file half pulled, would outlive it)."""
        self._puts.clear()
        self._drop_pulls()
        if self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)

    async def drain(self, timeout_s: float) -> None:
        """At a stop: the pulls dropped, the puts queued given `timeout_s`; what is left stays local."""
        self._drop_pulls()
        if self._task is None or self._task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            self.log.warning("kv_chains_not_all_shared", left=len(self._puts))
            self._task.cancel()
        except Exception:  # the lane's own failure: logged, and the stop goes on
            self.log.exception("kv_chains_lane_failed")

    def _drop_pulls(self) -> None:
        self._pulls.clear()
        self._pulling.clear()

    def _run(self) -> None:
        if (self._sweep or self._puts or self._pulls) and (self._task is None or self._task.done()):
            # Not the actor's `spawn`: a stop cancels spawned tasks first, and lets this one finish its puts.
            self._task = asyncio.create_task(self._work(), name="kv_chains_bucket")

    async def _work(self) -> None:
        """Puts, then pulls, until both queues are empty; logs what moved (`kv_chains_put`,
        `kv_chains_pulled`: chains, bytes and the seconds the lane took)."""
        moved = {"put": [0, 0], "pulled": [0, 0]}  # chains, bytes
        started = time.monotonic()
        if self._sweep:
            self._sweep = False
            await self.shared.sweep_orphans()
        while self._puts or self._pulls:
            await self._after_fetches()
            if self._puts:
                namespace, path, hashes = self._puts.popleft()
                if (size := await self._put(namespace, path, hashes)) is not None:
                    moved["put"] = [moved["put"][0] + 1, moved["put"][1] + size]
            elif self._pulls:
                namespace, name, size, hashes = self._pulls.popleft()
                self._pulling.discard(name)
                if await self._pull(namespace, name, hashes):
                    moved["pulled"] = [moved["pulled"][0] + 1, moved["pulled"][1] + size]
        seconds = round(time.monotonic() - started, 3)
        for what, (chains, size) in moved.items():
            if chains:
                self.log.info(f"kv_chains_{what}", chains=chains, bytes=size, seconds=seconds)

    async def _after_fetches(self) -> None:
        """Returns once no fetch is queued or being read, or after HOLD_S: a steady flow of fetches
        must not keep the chains out of the bucket for ever."""
        try:
            await asyncio.wait_for(self._no_fetches.wait(), HOLD_S)
        except TimeoutError:
            pass

    async def _put(self, namespace: str, path: Path, hashes: list[bytes]) -> int | None:
        """Puts one chain file in the bucket; its size, or None if it was not put now."""
        try:
            return await self.shared.put(namespace, path, hashes)
        except (JetStreamError, OSError) as exc:  # JetStream away or full, the file unreadable: it stays local
            self.log.warning("kv_chain_not_shared", file=path.name, error=str(exc))
            return None

    async def _pull(self, namespace: str, name: str, hashes: list[bytes]) -> bool:
        """Brings one chain from the bucket into the disk, unless the disk has it by now."""
        store = self._store(namespace)
        if store is None or store.held_prefix(hashes) == len(hashes):
            return False
        try:
            temp = await self.shared.get(name, store.directory)
            return await asyncio.to_thread(store.adopt, temp)
        except (JetStreamError, OSError) as exc:  # the object gone or damaged, JetStream away: recomputed
            self.log.warning("kv_chain_not_pulled", object=name, error=str(exc))
            return False
