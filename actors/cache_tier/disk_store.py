"""The disk tier of the KV cache: block chains in files under root/<namespace>/, found by their
blocks' hashes (actors/lib/block_hashes.py). The cache_tier actor owns one DiskStore: it reads
chains into host slots on a hit and writes here the chains that leave the host tier (and sessions'
chains). A file that fails a check is removed and its read ends short: a shorter hit, never wrong
KV. The file format is actors/cache_tier/chain_file.py's; which file holds which block, and which
files the size cap deletes, actors/cache_tier/chain_index.py's.
"""

import errno
import os
import re
import threading
from concurrent.futures import Executor
from pathlib import Path
from typing import NamedTuple

import structlog

from actors.cache_tier import chain_file
from actors.cache_tier.chain_file import ChainHeader, Malformed
from actors.cache_tier.chain_index import Chain, ChainIndex
from actors.lib.block_hashes import extend_hashes, root_hash

log = structlog.get_logger()
NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a directory name: namespace_key's hex, or a test's
READ_PIECE_BLOCKS = 8  # blocks a reader thread reads and checks as one task


class DiskStats(NamedTuple):
    files: int
    blocks: int
    bytes: int  # the files' sizes, headers included
    hits: int  # blocks longest_prefix found
    misses: int  # blocks longest_prefix was asked for and did not find
    corrupt: int  # files removed because a check failed (at start or on a read)


class _Piece(NamedTuple):
    """hashes[start:stop] of a read, blocks first.. of file `name`."""

    start: int
    stop: int
    name: str
    first: int


class _Inline:
    """The calling thread as an executor: a read without a pool."""

    def map(self, function, items):
        return map(function, items)


class DiskStore:
    """Chains of blocks of `block_bytes` each, at most `capacity_bytes` of files, least recently
    used files deleted first. A read refreshes the files it reads, a put those of its chain; the
    files nearer a prompt's start are refreshed last, so a chain's tail is deleted before its head
    (a tail without its head is never found, the head alone still is).

    A read, a put and an adopt may run at once, on three threads (the actor's lanes): the index is
    touched under a lock, the files' reads and writes outside it. A file a put evicts while a read has it
    open is still read whole (its data lives until closed); one it evicts before the read opens it
    is a miss, as one another process deleted is: several processes may share a directory (writes
    are atomic renames), each with its own index. One read and one put at a time, at most: the
    actor makes the next of each kind once the last has returned.
    """

    def __init__(self, root: Path, namespace: str, block_bytes: int, capacity_bytes: int) -> None:
        if not NAMESPACE.match(namespace):
            raise ValueError(f"namespace must be a plain directory name (letters, digits, _ or -), not {namespace!r}")
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, not {block_bytes}")
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, not {capacity_bytes}")
        self.directory = Path(root) / namespace
        self.namespace = namespace
        self.block_bytes = block_bytes
        self.capacity_bytes = capacity_bytes
        self._hits = self._misses = 0
        self._lock = threading.Lock()  # over the index, the figures
        self.directory.mkdir(parents=True, exist_ok=True)
        self._index = ChainIndex(self.directory, namespace, block_bytes, capacity_bytes)

    def put(
        self, hashes: list[bytes], token_ids: list[int], blocks: list[memoryview], parent: bytes | None = None
    ) -> int:
        """Stores a chain: blocks[i] holds the bytes of the block hashed hashes[i], whose tokens are
        token_ids[i * block_size : (i + 1) * block_size]; `parent` is the hash of the block before
        hashes[0] (None: the chain starts a prompt). Blocks already stored are skipped. Returns the
        blocks written; a write the disk refuses (full, or any OSError) is logged and ends the put,
        and later puts try again."""
        if len(blocks) != len(hashes) or not hashes or len(token_ids) % len(hashes):
            raise ValueError(
                f"{len(hashes)} hashes need as many blocks ({len(blocks)}) and block_size tokens each ({len(token_ids)})"
            )
        for i, block in enumerate(blocks):
            if memoryview(block).nbytes != self.block_bytes:
                raise ValueError(f"blocks[{i}] has {memoryview(block).nbytes} bytes, not {self.block_bytes}")
        block_size = len(token_ids) // len(hashes)
        before = parent if parent is not None else root_hash(self.namespace)
        if extend_hashes(before, token_ids, block_size) != list(hashes):
            raise ValueError("hashes do not follow from parent and token_ids")
        with self._lock:
            self._index.refresh(hashes)
            runs = self._index.missing_runs(hashes)
        written = 0
        for start, stop in runs:
            run_parent = parent if start == 0 else hashes[start - 1]
            run_tokens = list(token_ids[start * block_size : stop * block_size])
            try:
                if not self._write(hashes[start:stop], run_tokens, blocks[start:stop], run_parent):
                    break
            except OSError as error:
                log.warning(
                    "disk_tier_write_failed",
                    directory=str(self.directory),
                    errno=errno.errorcode.get(error.errno or 0, error.errno),
                    error=str(error),
                    blocks=stop - start,
                )
                break
            written += stop - start
        with self._lock:
            self._index.refresh(hashes)
        return written

    def adopt(self, temp: Path) -> bool:
        """Takes in a chain file brought from elsewhere (JetStream's shared chains), written to
        `temp` in this namespace's directory: checked as a file found at start is (its header and
        size; its blocks are checked when read), renamed to its chain's name and indexed, making
        room as a put does. A file that is not a whole chain of this namespace, or larger than the
        tier, is removed; returns whether it was taken."""
        try:
            _, chain = self._index.check(temp)
        except (Malformed, OSError) as error:
            log.warning("disk_tier_file_removed", file=str(temp), reason=str(error))
            temp.unlink(missing_ok=True)
            return False
        if chain.size_bytes > self.capacity_bytes:
            temp.unlink(missing_ok=True)
            return False
        name = chain_file.file_name(chain.hashes)
        with self._lock:
            self._index.evict(chain.size_bytes)
        try:
            os.replace(temp, self.directory / name)
        except OSError:
            temp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._index.forget(name)
            self._index.add(name, chain)
        return True

    def files_of(self, hashes: list[bytes]) -> dict[str, list[bytes]]:
        """The files that hold any of `hashes`, each with every block hash it holds."""
        with self._lock:
            names = dict.fromkeys(where[0] for h in hashes if (where := self._index.blocks.get(h)) is not None)
            return {name: list(self._index.files[name].hashes) for name in names}

    def held_prefix(self, hashes: list[bytes]) -> int:
        """How many leading blocks of the chain the index has (no figure counts this look)."""
        with self._lock:
            found = 0
            while found < len(hashes) and hashes[found] in self._index.blocks:
                found += 1
            return found

    def holds(self, block_hash: bytes) -> bool:
        """Whether the index has the block (no figure counts this look)."""
        with self._lock:
            return block_hash in self._index.blocks

    def hashes(self) -> list[bytes]:
        """Every block the index has."""
        with self._lock:
            return list(self._index.blocks)

    def longest_prefix(self, hashes: list[bytes]) -> int:
        """How many leading blocks of the chain are on disk, from the index alone; counted in the
        hit and miss figures."""
        found = self.held_prefix(hashes)
        with self._lock:
            self._hits += found
            self._misses += len(hashes) - found
        return found

    def read(self, hashes: list[bytes], out: list[memoryview], pool: Executor | None = None) -> int:
        """Fills out[i] (writable, block_bytes each) with the block hashed hashes[i], for the leading
        blocks on disk; returns how many. Every block is checked against its checksum: the first that
        fails (damaged, truncated, its file gone) ends the read, its file removed. out[i] past the
        count returned may hold anything. With `pool`, pieces of READ_PIECE_BLOCKS blocks are read
        and checked on its threads at once (reads and checks leave the GIL): a chain of some GB comes
        back at several times one thread's rate; the index is still touched by the caller alone."""
        if len(out) != len(hashes):
            raise ValueError(f"out has {len(out)} views for {len(hashes)} hashes")
        for i, view in enumerate(out):
            if memoryview(view).nbytes != self.block_bytes:
                raise ValueError(f"out[{i}] has {memoryview(view).nbytes} bytes, not {self.block_bytes}")
        with self._lock:
            pieces = self._pieces(hashes)
        read = lambda piece: self._read_piece(piece, hashes[piece.start : piece.stop], out[piece.start : piece.stop])
        done, results = 0, list((pool or _Inline()).map(read, pieces))
        with self._lock:
            for piece, (got, problem) in zip(pieces, results):
                if problem is not None:
                    self._index.give_up(piece.name, problem, got)
                if done == piece.start:
                    done += got
            self._index.refresh(hashes[:done])
        return done

    def stats(self) -> DiskStats:
        index = self._index
        with self._lock:
            return DiskStats(
                len(index.files), len(index.blocks), index.used_bytes, self._hits, self._misses, index.corrupt
            )

    def clear(self) -> int:
        """Deletes every chain of this namespace (other processes' too); returns the blocks freed."""
        with self._lock:
            freed = len(self._index.blocks)
            for name in list(self._index.files):
                self._index.remove(name)
        for entry in os.scandir(self.directory):
            if not entry.is_dir(follow_symlinks=False):
                Path(entry.path).unlink(missing_ok=True)
        log.info("disk_tier_cleared", directory=str(self.directory), blocks=freed)
        return freed

    def _pieces(self, hashes: list[bytes]) -> list["_Piece"]:
        """The leading hashes the index holds, cut where the file changes, where a file's blocks
        stop following one another, and every READ_PIECE_BLOCKS blocks."""
        pieces: list[_Piece] = []
        for i, block_hash in enumerate(hashes):
            if (where := self._index.blocks.get(block_hash)) is None:
                break
            name, index = where
            last = pieces[-1] if pieces else None
            if (
                last
                and last.name == name
                and last.first + (i - last.start) == index
                and i - last.start < READ_PIECE_BLOCKS
            ):
                pieces[-1] = last._replace(stop=i + 1)
            else:
                pieces.append(_Piece(i, i + 1, name, index))
        return pieces

    def _read_piece(self, piece: "_Piece", hashes: list[bytes], out: list[memoryview]) -> tuple[int, str | None]:
        """Reads and checks one piece; touches no index (it may run on any thread): (blocks read, and
        what went wrong with the file, if anything: "gone", "replaced", or why it is malformed)."""
        try:
            fd = os.open(self.directory / piece.name, os.O_RDONLY)
        except FileNotFoundError:
            return 0, "gone"  # deleted by another process sharing the directory
        i = 0
        try:
            header, data_offset = chain_file.read_header(fd, self.namespace, self.block_bytes)
            for i, block_hash in enumerate(hashes):
                index = piece.first + i
                if index >= len(header.hashes) or header.hashes[index] != block_hash:
                    return i, "replaced"  # by another process, with another run of the chain
                offset = data_offset + index * self.block_bytes
                if not chain_file.read_block(fd, out[i], offset):
                    raise Malformed(f"truncated in block {index}")
                if chain_file.checksum(out[i]) != header.checksums[index]:
                    raise Malformed(f"block {index} fails its checksum")
            return len(hashes), None
        except (Malformed, OSError) as error:
            return i, str(error)
        finally:
            os.close(fd)

    def _write(self, hashes: list[bytes], token_ids: list[int], blocks: list[memoryview], parent: bytes | None) -> bool:
        checksums = [chain_file.checksum(memoryview(block).cast("B")) for block in blocks]
        header = ChainHeader(self.namespace, self.block_bytes, parent, hashes, token_ids, checksums)
        encoded = chain_file.encode_header(header)
        size = chain_file.file_bytes(len(encoded), len(blocks), self.block_bytes)
        if size > self.capacity_bytes:
            log.warning("disk_tier_chain_too_large", bytes=size, capacity_bytes=self.capacity_bytes)
            return False
        with self._lock:
            self._index.evict(size)
        name = chain_file.write_chain(self.directory, header, encoded, blocks).name
        with self._lock:
            self._index.forget(name)  # a file of that name another process (or this one) wrote, now replaced
            self._index.add(name, Chain(hashes, parent, size))
        return True


def remove_chains(root: Path) -> int:
    """Deletes the chain files, and the temporary files of writes under way, of every namespace
    directory under `root` (whichever process wrote them, whichever DiskStore indexes them: each
    finds a file gone a miss); returns how many. The directories stay, for the stores open on them."""
    if not root.is_dir():
        return 0
    removed, ours = 0, (chain_file.SUFFIX, chain_file.TEMP_SUFFIX)
    for namespace in os.scandir(root):
        if not namespace.is_dir(follow_symlinks=False) or not NAMESPACE.match(namespace.name):
            continue
        for entry in os.scandir(namespace.path):
            if entry.is_file(follow_symlinks=False) and entry.name.endswith(ours):
                Path(entry.path).unlink(missing_ok=True)
                removed += 1
    return removed
