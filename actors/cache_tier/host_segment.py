"""The host tier's memory: slots of one block each in ONE POSIX shared-memory segment
(/dev/shm/<name>), which the executor creates (and pins, to copy KV in and out: gpu/kv_transfer.py)
and the cache_tier actor maps by name. The segment outlives its processes, and a table beside the slots
records the block hash each slot holds, so a cache_tier that restarts finds its blocks again.

Layout: a header (magic, format version, geometry, offsets), the table (per slot a 16-byte hash and
a flag), then the slots, each starting on a 4096-byte boundary so a slot is DMA'd in one piece.
The file is opened with os.open and mmap rather than multiprocessing.shared_memory, whose resource
tracker unlinks a segment when the process that made it exits.
"""

import ctypes
import hashlib
import mmap
import os
import re
import struct
from concurrent.futures import Executor
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")  # a file of SHM_DIR, never hidden: building ones are
MAGIC = b"KVHOST\x00\x01"
FORMAT_VERSION = 1
ALIGN = 4096
HASH_BYTES = 16
# magic, format version, (pad), num_slots, slot_bytes, slot_stride, table_offset, slots_offset
HEADER = struct.Struct("<8sI4xQQQQQ")
ENTRY = struct.Struct("<16s?7x")  # per slot: the block hash it holds, and whether it holds one
MADV_POPULATE_WRITE = 23  # Linux 5.14+: map the range's pages writable now, not at each first touch
PREFAULT_CHUNK = 256 << 20  # bytes per madvise call of `prefault`
_LIBC = ctypes.CDLL(None, use_errno=True)  # ctypes calls release the GIL: a prefault never stalls the loop
_LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class NoRoom(ValueError):
    """The segment does not fit in what /dev/shm has free."""


def segment_prefix(data_dir: str | os.PathLike) -> str:
    """The start of the names of one data dir's host segments (one per KV geometry)."""
    digest = hashlib.blake2b(os.path.realpath(data_dir).encode(), digest_size=8).hexdigest()
    return f"kvhost-{digest}-"


def remove_segments(data_dir: str | os.PathLike) -> list[str]:
    """Unlinks the data dir's host segments, once no process of its server maps them (their memory
    goes with the last mapping); returns their names. A new server does not reindex a segment's
    contents, so one left behind would only hold memory."""
    removed = []
    for path in SHM_DIR.glob(f"{segment_prefix(data_dir)}*"):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


class HostSegment:
    """`num_slots` slots of `slot_bytes` in one shared-memory segment, mapped read-write.

    Invariant: a slot's table entry is set (`record(slot, hash)`) only once its bytes are complete,
    and cleared (`record(slot, None)`) before they are overwritten, so what `recorded()` returns after
    any crash names whole blocks. Which process writes the table is the owner's rule (cache_tier)."""

    def __init__(self, name: str, mapping: mmap.mmap) -> None:
        """Over `mapping`, the whole segment; `create` and `attach` make one."""
        self.name = name
        self._map = mapping
        magic, version, *geometry = HEADER.unpack_from(mapping, 0)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise ValueError(f"name: /dev/shm/{name} is not a host segment of format {FORMAT_VERSION}")
        self.num_slots, self.slot_bytes, self.slot_stride, self._table_offset, self._slots_offset = geometry
        if len(mapping) < self._slots_offset + self.num_slots * self.slot_stride:
            raise ValueError(f"name: /dev/shm/{name} is shorter than its header says (truncated)")
        self._slots: np.ndarray | None = None

    @classmethod
    def create(cls, name: str, num_slots: int, slot_bytes: int) -> "HostSegment":
        """The segment `name` with this geometry: the existing one, contents kept, if its header says
        the same geometry; otherwise a new zeroed one that replaces it. Its memory is reserved now
        (posix_fallocate), so a full /dev/shm fails here rather than as a SIGBUS on a later write."""
        path = _path(name)
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        if slot_bytes <= 0:
            raise ValueError(f"slot_bytes must be positive, got {slot_bytes}")
        try:
            existing = _open(name)
        except ValueError:
            existing = None  # not a segment of this format: replaced below
        if existing is not None and (existing.num_slots, existing.slot_bytes) == (num_slots, slot_bytes):
            return existing
        if existing is not None:
            existing.close()
        # Whatever was there goes first (its memory with it, once no process maps it), and any
        # half-made segment a killed creator left.
        path.unlink(missing_ok=True)
        for left in SHM_DIR.glob(f".{name}.*.building"):
            pid = left.name.rsplit(".", 2)[-2]
            if pid.isdigit() and not _alive(int(pid)):
                left.unlink(missing_ok=True)
        slot_stride = _round_up(slot_bytes, ALIGN)
        table_offset = _round_up(HEADER.size, 64)
        slots_offset = _round_up(table_offset + num_slots * ENTRY.size, ALIGN)
        size = slots_offset + num_slots * slot_stride
        free = _free_bytes()
        if size > free:
            raise NoRoom(
                f"{num_slots} slots of {slot_bytes} bytes need {size} bytes, more than the {free} free in {SHM_DIR}"
            )
        # Built under a temporary name and renamed into place, so no process attaches a half-made one.
        building = path.with_name(f".{name}.{os.getpid()}.building")
        fd = os.open(building, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as error:  # taken since it was measured free, or over a cgroup's memory limit
                raise NoRoom(f"{size} bytes could not be reserved in {SHM_DIR}: {error.strerror}") from None
            mapping = mmap.mmap(fd, size)
            HEADER.pack_into(
                mapping, 0, MAGIC, FORMAT_VERSION, num_slots, slot_bytes, slot_stride, table_offset, slots_offset
            )
            os.rename(building, path)
        except BaseException:
            building.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return cls(name, mapping)

    @classmethod
    def attach(cls, name: str) -> "HostSegment":
        """The existing segment `name`, its geometry read from its header."""
        segment = _open(name)
        if segment is None:
            raise FileNotFoundError(f"name: no host segment /dev/shm/{name}")
        return segment

    def slots(self) -> np.ndarray:
        """uint8 [num_slots, slot_bytes], a view of the segment (row stride `slot_stride`): writes land
        in the shared memory. The mapping lives as long as any array taken from it. NumPy, not torch:
        the cache_tier, which only reads and writes bytes, starts without importing torch; the
        executor wraps it (`torch.from_numpy`, no copy)."""
        if self._map is None:
            raise ValueError(f"host segment {self.name} is closed")
        if self._slots is None:
            # Through a memoryview, which the array keeps: while one lives the mmap refuses to close,
            # so no array ever points at unmapped memory.
            size = self.num_slots * self.slot_stride
            region = np.frombuffer(memoryview(self._map)[self._slots_offset : self._slots_offset + size], np.uint8)
            self._slots = region.reshape(self.num_slots, self.slot_stride)[:, : self.slot_bytes]
        return self._slots

    def prefault(self, pool: Executor | None = None) -> None:
        """Maps every slot's pages into this process's page tables now (the pages themselves exist:
        the executor made and pinned them), in PREFAULT_CHUNK pieces on `pool`'s threads. Otherwise
        each 4 KiB page costs a fault at its first touch here, and a restarted cache_tier read a
        restart's 2 GiB chain into fresh slots at 13 GB/s instead of 21. One thread maps about 6
        GB/s: a 24 GiB segment on one thread was still being mapped when a restart's prompt was
        read, and slowed it (docs/journal/2026-11-27-restart-reads.md). Raises OSError where the
        kernel cannot (before Linux 5.14), ValueError if the segment is closed."""
        slots = self.slots()  # keeps the mapping alive while this runs, even past a close()
        base, size = slots.ctypes.data, self.num_slots * self.slot_stride

        def populate(start: int) -> None:
            if _LIBC.madvise(base + start, min(PREFAULT_CHUNK, size - start), MADV_POPULATE_WRITE) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"madvise(MADV_POPULATE_WRITE): {os.strerror(error)}")

        for _ in (pool.map if pool else map)(populate, range(0, size, PREFAULT_CHUNK)):
            pass

    def record(self, slot: int, block_hash: bytes | None) -> None:
        """Slot `slot` holds the block `block_hash` (None: no block). Only the owner of the table calls this."""
        if self._map is None:
            raise ValueError(f"host segment {self.name} is closed")
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot must be in [0, {self.num_slots}), got {slot}")
        if block_hash is not None and len(block_hash) != HASH_BYTES:
            raise ValueError(f"block_hash must be {HASH_BYTES} bytes, got {len(block_hash)}")
        entry = self._table_offset + slot * ENTRY.size
        # The flag goes off before the hash changes and on after, so a writer killed in between
        # leaves the slot empty, never naming a block it does not hold.
        self._map[entry + HASH_BYTES] = 0
        if block_hash is not None:
            self._map[entry : entry + HASH_BYTES] = block_hash
            self._map[entry + HASH_BYTES] = 1

    def recorded(self) -> dict[int, bytes]:
        """slot -> block hash, for the slots that hold one."""
        if self._map is None:
            raise ValueError(f"host segment {self.name} is closed")
        table = self._map[self._table_offset : self._table_offset + self.num_slots * ENTRY.size]
        return {slot: h for slot, (h, held) in enumerate(ENTRY.iter_unpack(table)) if held}

    def close(self) -> None:
        """Unmaps the segment from this process (it stays in /dev/shm). Arrays still held from
        `slots()` keep the mapping until the last of them goes."""
        self._slots = None
        mapping, self._map = self._map, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # exported to live slots() arrays: unmapped when they are freed

    def unlink(self) -> None:
        """Removes the segment's name; processes that have it mapped keep their mapping."""
        _path(self.name).unlink(missing_ok=True)


def _path(name: str) -> Path:
    if not NAME.fullmatch(name):
        raise ValueError(f"name must be letters, digits, '_', '-' or '.' (not first), got {name!r}")
    return SHM_DIR / name


def _open(name: str) -> HostSegment | None:
    """The segment `name` mapped read-write; None if there is no such file, ValueError if the file
    is not a whole segment."""
    path = _path(name)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < HEADER.size:
            raise ValueError(f"name: /dev/shm/{name} is not a host segment ({size} bytes)")
        mapping = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    try:
        return HostSegment(name, mapping)
    except ValueError:
        mapping.close()
        raise


def _free_bytes() -> int:
    stats = os.statvfs(SHM_DIR)
    return stats.f_bavail * stats.f_frsize


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
