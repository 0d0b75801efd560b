"""The index of the disk tier's chain files in one namespace directory: which file holds which
block, rebuilt from the files' headers at start, kept in least recently used order and cut to the
size cap. actors/cache_tier/disk_store.py owns one and reads and writes the chains it names.
"""

import os
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import structlog

from actors.cache_tier import chain_file
from actors.cache_tier.chain_file import Malformed

log = structlog.get_logger()


class Chain(NamedTuple):
    hashes: list[bytes]
    parent: bytes | None  # the hash of the block before the file's first
    size_bytes: int


class ChainIndex:
    """The chain files of `directory`, least recently used first, at most `capacity_bytes` of them:
    `evict` deletes files from the front. `blocks` maps each block's hash to its file and its index
    in the file; `used_bytes` is the files' sizes, headers included; `corrupt` counts the files
    removed because a check failed (at start or on a read).

    Not thread-safe: its owner (DiskStore) holds a lock around each use.
    """

    def __init__(self, directory: Path, namespace: str, block_bytes: int, capacity_bytes: int) -> None:
        self.directory = directory
        self.namespace = namespace
        self.block_bytes = block_bytes
        self.capacity_bytes = capacity_bytes
        self.files: OrderedDict[str, Chain] = OrderedDict()  # least recently used first
        self.blocks: dict[bytes, tuple[str, int]] = {}  # hash -> (file name, index in the file)
        self.used_bytes = 0
        self.corrupt = 0
        self._rebuild()

    def _rebuild(self) -> None:
        """Rebuilds the index from the files' headers (no block is read); removes temp files and
        every file that is not a whole chain of this namespace; least recently written first."""
        found, removed = [], 0
        for entry in os.scandir(self.directory):
            if entry.is_dir(follow_symlinks=False):
                continue
            try:
                mtime_ns, chain = self._check_file(entry)
                found.append((mtime_ns, entry.name, chain))
            except (Malformed, OSError) as error:
                if not entry.name.endswith(chain_file.TEMP_SUFFIX):
                    self.corrupt += 1
                    log.warning("disk_tier_file_removed", file=entry.path, reason=str(error))
                Path(entry.path).unlink(missing_ok=True)
                removed += 1
        for _, name, chain in sorted(found, key=lambda f: f[:2]):
            self.add(name, chain)
        self.evict(0)  # the capacity may be smaller than the last run's
        log.info(
            "disk_tier_indexed",
            directory=str(self.directory),
            files=len(self.files),
            blocks=len(self.blocks),
            bytes=self.used_bytes,
            removed=removed,
        )

    def _check_file(self, entry: os.DirEntry) -> tuple[int, Chain]:
        if entry.name.startswith(".") or not entry.name.endswith(chain_file.SUFFIX):
            raise Malformed("not a chain file's name")
        mtime_ns, chain = self.check(entry.path)
        if entry.name != chain_file.file_name(chain.hashes):
            raise Malformed("named after another block")
        return mtime_ns, chain

    def check(self, path: str | Path) -> tuple[int, Chain]:
        """The chain in the file at `path` and the file's modification time, from its header (no
        block is read); raises `Malformed` if it is not a whole chain of this namespace."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            header, data_offset = chain_file.read_header(fd, self.namespace, self.block_bytes)
            status = os.fstat(fd)
        finally:
            os.close(fd)
        if status.st_size != data_offset + len(header.hashes) * self.block_bytes:
            raise Malformed(f"{status.st_size} bytes, not the header's")
        return status.st_mtime_ns, Chain(header.hashes, header.parent, status.st_size)

    def give_up(self, name: str, problem: str, served: int) -> None:
        """A file a read found gone or replaced is forgotten; a malformed one is removed."""
        if name not in self.files:
            return  # another piece of the same file said so first
        if problem in ("gone", "replaced"):
            self.forget(name)
            return
        self.corrupt += 1
        log.warning("disk_tier_file_removed", file=name, reason=problem, served_blocks=served)
        self.remove(name)

    def missing_runs(self, hashes: list[bytes]) -> list[tuple[int, int]]:
        """[start, stop) of each run of consecutive blocks not on disk yet."""
        runs = []
        for i, block_hash in enumerate(hashes):
            if block_hash in self.blocks:
                continue
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        return runs

    def refresh(self, hashes: list[bytes]) -> None:
        """Marks the files holding the chain, and those holding the blocks before it, used now:
        the one nearest the prompt's start last, so it is the last of them to be evicted."""
        names = list(dict.fromkeys(where[0] for h in hashes if (where := self.blocks.get(h)) is not None))
        while names and (parent := self.files[names[0]].parent) in self.blocks:
            name = self.blocks[parent][0]
            if name in names:
                break
            names.insert(0, name)
        for name in reversed(names):
            self.files.move_to_end(name)

    def evict(self, incoming_bytes: int) -> None:
        while self.files and self.used_bytes + incoming_bytes > self.capacity_bytes:
            self.remove(next(iter(self.files)))

    def add(self, name: str, chain: Chain) -> None:
        self.files[name] = chain
        self.used_bytes += chain.size_bytes
        for i, block_hash in enumerate(chain.hashes):
            self.blocks[block_hash] = (name, i)

    def forget(self, name: str) -> None:
        chain = self.files.pop(name, None)
        if chain is None:
            return
        self.used_bytes -= chain.size_bytes
        for i, block_hash in enumerate(chain.hashes):
            if self.blocks.get(block_hash) == (name, i):
                del self.blocks[block_hash]

    def remove(self, name: str) -> None:
        self.forget(name)
        try:
            (self.directory / name).unlink(missing_ok=True)
        except OSError as error:
            log.warning("disk_tier_remove_failed", file=name, error=str(error))
