"""The disk tier's chain files shared through JetStream's object store, for servers on several
machines: with an external NATS whose JetStream keeps the sessions (`--session-store`), what one
server's disk tier wrote under the checkpoint's own weights is put in the namespace's object bucket
as well, and a server on another machine, when its scheduler first lists what the disk holds,
pulls the chains its disk lacks from there, in the background, newest first. A session restored
on that machine then recomputes nothing its last server's disk held, once the pull has brought it.
No prompt waits for the bucket: a fetch reads the local disk only, so a chain not pulled yet is
recomputed, as it would be without the bucket.

An object is a chain file, byte for byte, named `<KV namespace>/<file name>`; its description
lists the hashes of its blocks (hex, by spaces), so a listing of the bucket says which blocks it
holds without reading any. The file brought back goes into the local disk tier
(`DiskStore.adopt`) and is read from there: its blocks are checked as any local file's are. The
bucket holds at most the disk tier's size (`--disk-kv-gb`); a put that would pass it first deletes
the objects put longest ago. The chunks of puts that a kill cut short are swept out once, in the
background, after a cache_tier starts.
"""

import os
import secrets
from collections import OrderedDict
from pathlib import Path

import structlog

from actors.cache_tier.chain_file import TEMP_SUFFIX
from kernel.bus import Bus
from kernel.bus_jetstream import JetStreamError
from kernel.bus_objects import ObjectBucket, StoredObject
from kernel.config import KernelConfig

log = structlog.get_logger()
GET_TIMEOUT_S = 30.0  # for one chain (an 8B model's 256 blocks are 512 MiB)
META_BYTES = 1024  # an object's meta message, less its description (about 33 bytes a block)
# A put's chunks that no object names, and older than this by the stream's newest message, are a
# put a kill cut short, swept after a start; younger ones may be another server's put under way.
ORPHAN_CHUNKS_AGE_S = 600.0


class SharedChains:
    """The namespace's object bucket of chain files, and what this process knows it holds."""

    def __init__(self, bucket: ObjectBucket, capacity_bytes: int) -> None:
        self.bucket = bucket
        self.capacity_bytes = capacity_bytes
        self._objects: OrderedDict[str, StoredObject] = OrderedDict()  # put longest ago first
        self._hashes: dict[str, list[bytes]] = {}  # object name -> its blocks' hashes

    async def refresh(self) -> None:
        """Lists the bucket again: what other servers put since counts from now on."""
        objects = await self.bucket.objects()
        self._objects = OrderedDict((stored.name, stored) for stored in objects)
        self._hashes = {stored.name: [bytes.fromhex(h) for h in stored.description.split()] for stored in objects}

    @property
    def objects_held(self) -> int:
        return len(self._objects)

    def hashes(self, namespace: str) -> list[bytes]:
        """Every block the bucket holds in the KV namespace."""
        return [h for name in self._objects if _namespace(name) == namespace for h in self._hashes[name]]

    def newest_first(self, namespace: str) -> list[tuple[str, int, list[bytes]]]:
        """(name, size, its blocks' hashes) of each object of the KV namespace, put latest first."""
        names = [name for name in reversed(self._objects) if _namespace(name) == namespace]
        return [(name, self._objects[name].size, self._hashes[name]) for name in names]

    def holds_file(self, namespace: str, file_name: str) -> bool:
        return f"{namespace}/{file_name}" in self._objects

    async def put(self, namespace: str, path: Path, hashes: list[bytes]) -> int | None:
        """Puts the chain file at `path`, which holds `hashes`, making room first; returns its
        size, or None where it was not put: in the bucket already, larger than it, or gone from the
        disk meanwhile (evicted). Raises `JetStreamError` where the bucket did not take it."""
        name = f"{namespace}/{path.name}"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        if name in self._objects or size > self.capacity_bytes:
            return None
        # Beside the file: each chunk's headers, and the meta message that lists the blocks.
        await self._make_room(size + size // 100 + META_BYTES + 40 * len(hashes))
        try:
            await self.bucket.put_file(name, path, " ".join(h.hex() for h in hashes))
        except FileNotFoundError:
            return None
        self._objects[name] = StoredObject(name, size, "", 0)  # its description is `hashes`
        self._hashes[name] = list(hashes)
        return size

    async def _make_room(self, needed: int) -> None:
        """Deletes the objects put longest ago until the bucket's stream (every server's objects,
        their meta messages) has room for `needed` more bytes. Objects this process does not know
        of yet (other servers' puts since the last listing) are listed once, when it knows of none
        left to delete."""
        listed = False
        while await self.bucket.used_bytes() + needed > self.capacity_bytes:
            if not self._objects:
                if listed:
                    return  # the put will be refused, and the chain stays local
                await self.refresh()
                listed = True
                continue
            oldest = next(iter(self._objects))
            await self.bucket.delete(oldest)
            self._forget(oldest)

    async def get(self, name: str, directory: Path) -> Path:
        """Writes object `name` to a temporary file in `directory` and returns its path; raises
        `JetStreamError` where it did not come back whole (and forgets the object)."""
        temp = directory / f".shared.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            await self.bucket.get_file(name, temp, GET_TIMEOUT_S)
        except JetStreamError:
            temp.unlink(missing_ok=True)
            self._forget(name)
            raise
        except BaseException:  # a full disk, say, or the actor stopping: no temporary file is left
            temp.unlink(missing_ok=True)
            raise
        return temp

    async def sweep_orphans(self) -> None:
        """Purges the chunks of puts that a kill cut short, older than ORPHAN_CHUNKS_AGE_S; a
        bucket that fails is left as it is (the chunks cost room, not harm)."""
        try:
            if dropped := await self.bucket.drop_orphan_chunks(ORPHAN_CHUNKS_AGE_S):
                log.info("kv_chains_orphans_dropped", bucket=self.bucket.name, puts=dropped)
        except JetStreamError as exc:
            log.warning("kv_chains_not_swept", bucket=self.bucket.name, reason=str(exc))

    async def clear(self) -> None:
        """Deletes every object (an admin's flush of the disk tier)."""
        await self.bucket.purge()
        self._objects.clear()
        self._hashes.clear()

    def _forget(self, name: str) -> None:
        self._objects.pop(name, None)
        self._hashes.pop(name, None)


def _namespace(name: str) -> str:
    return name.partition("/")[0]


async def open_shared_chains(config: KernelConfig, bus: Bus, name: str, capacity_bytes: int) -> SharedChains | None:
    """The bus namespace's object bucket where the sessions are in JetStream (`--session-store`
    `jetstream`, or `auto` on an external NATS that has JetStream); None where they are in files.
    A bucket that cannot be opened (no JetStream, or too little room for `capacity_bytes`) leaves
    the chains local, with a warning: they are a cache, the sessions' records are not."""
    store = config.supervision.session_store
    if store == "files" or capacity_bytes <= 0:
        return None
    try:
        bucket = await bus.object_bucket(name, capacity_bytes)
    except JetStreamError as exc:
        log.warning("kv_chains_not_shared", bucket=name, reason=str(exc))
        return None
    shared = SharedChains(bucket, capacity_bytes)
    try:
        await shared.refresh()
    except JetStreamError as exc:
        log.warning("kv_chains_not_listed", bucket=name, reason=str(exc))
    log.info("kv_chains_shared", bucket=name, objects=shared.objects_held)
    return shared
