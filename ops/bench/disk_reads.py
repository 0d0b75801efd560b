"""Reading files from the disk itself, not the page cache: the references of the benchmarks whose
figures a disk's read rate bounds (weight loading, the disk tier's restore)."""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from actors.cache_tier.actor import READ_THREADS
from gpu.safetensors_stream import CHUNK_BYTES


def drop_from_page_cache(files: list[Path]) -> None:
    """Evicts the files' pages (clean once synced; no privileges needed), so the next read of them
    comes from the disk."""
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_seconds(files: list[Path]) -> float:
    """One sequential pass over the files in reads of the loader's size, as `cat` would do it."""
    chunk = memoryview(bytearray(CHUNK_BYTES))
    started = time.perf_counter()
    for file in files:
        with open(file, "rb", buffering=0) as f:
            while f.readinto(chunk):
                pass
    return time.perf_counter() - started


def cold_read_s(directory: Path, size: int) -> float:
    """The disk's own time to read `size` bytes of the files under `directory` out of the page
    cache, on as many threads as the disk tier reads with: what a restore that finds them there
    cannot go below. Listed now: a server that ran since may have replaced some."""
    files = sorted(path for path in directory.rglob("*") if path.is_file())
    drop_from_page_cache(files)
    chosen, total = [], 0
    for file in files:
        if total >= size:
            break
        chosen.append(file)
        total += file.stat().st_size
    started = time.perf_counter()
    with ThreadPoolExecutor(READ_THREADS) as readers:
        list(readers.map(Path.read_bytes, chosen))
    return (time.perf_counter() - started) * size / max(total, 1)
