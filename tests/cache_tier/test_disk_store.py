"""The disk tier on real files: chains come back byte for byte, across a restart and from another
process; a damaged, truncated or half-written file is detected and removed, and costs a shorter hit,
never wrong bytes; the size cap deletes least recently used files; a disk that is full (a real
ENOSPC) degrades the tier to reads and a warning."""

import multiprocessing
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from actors.cache_tier.disk_store import DiskStore, remove_chains
from actors.lib.block_hashes import block_hashes, namespace_key
from tests.full_disk import small_tmpfs

BLOCK_SIZE = 4  # tokens per block
BLOCK_BYTES = 1024
NS = namespace_key("weights-sha", "tokenizer-sha", "bfloat16", BLOCK_SIZE, "layout-1")
GIB = 1 << 30


class Chain:
    """A prompt's whole blocks: their tokens, hashes and (random) KV bytes."""

    def __init__(self, seed: int, blocks: int, namespace: str = NS) -> None:
        rng = random.Random(seed)
        self.token_ids = [rng.randrange(50_000) for _ in range(blocks * BLOCK_SIZE)]
        self.hashes = block_hashes(self.token_ids, BLOCK_SIZE, namespace)
        self.blocks = [memoryview(rng.randbytes(BLOCK_BYTES)) for _ in range(blocks)]

    def put(self, store: DiskStore, start: int = 0, stop: int | None = None) -> int:
        stop = len(self.hashes) if stop is None else stop
        parent = self.hashes[start - 1] if start else None
        tokens = self.token_ids[start * BLOCK_SIZE : stop * BLOCK_SIZE]
        return store.put(self.hashes[start:stop], tokens, self.blocks[start:stop], parent=parent)

    def read(self, store: DiskStore) -> int:
        """Blocks read; asserts each of them holds this chain's bytes."""
        out = [memoryview(bytearray(BLOCK_BYTES)) for _ in self.hashes]
        count = store.read(self.hashes, out)
        assert [bytes(o) for o in out[:count]] == [bytes(b) for b in self.blocks[:count]]
        return count


def chain_files(store: DiskStore) -> list[Path]:
    return sorted(store.directory.iterdir())


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_chain_comes_back_byte_for_byte_and_is_stored_once(tmp_path):
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    chain = Chain(seed=1, blocks=8)
    assert store.longest_prefix(chain.hashes) == 0
    assert chain.put(store, stop=5) == 5
    assert store.longest_prefix(chain.hashes) == 5
    assert chain.read(store) == 5
    assert chain.put(store) == 3  # the first five are on disk already: only the tail is written
    assert chain.put(store) == 0
    assert chain.read(store) == 8  # across both files
    stats = store.stats()
    assert (stats.files, stats.blocks, stats.hits, stats.misses, stats.corrupt) == (2, 8, 5, 11, 0)
    assert stats.bytes == sum(p.stat().st_size for p in chain_files(store))
    assert [p.name for p in chain_files(store)] == sorted(chain.hashes[i].hex() + ".kv" for i in (4, 7))


def test_a_chain_that_diverges_reads_its_shared_head(tmp_path):
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    chain = Chain(seed=1, blocks=4)
    chain.put(store)
    branch = Chain(seed=1, blocks=4)
    branch.token_ids[-1] += 1  # the last block's last token differs
    branch.hashes = block_hashes(branch.token_ids, BLOCK_SIZE, NS)
    assert store.longest_prefix(branch.hashes) == 3
    assert branch.read(store) == 3


def test_a_new_store_on_the_same_root_finds_every_chain_from_the_headers_alone(tmp_path):
    chains = [Chain(seed, blocks=3) for seed in range(4)]
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    for chain in chains:
        chain.put(store, stop=2)
        chain.put(store, start=2)  # a second file, whose parent is the first file's last block
    damaged = store.directory / (chains[0].hashes[1].hex() + ".kv")
    flip_byte(damaged, damaged.stat().st_size - 1)  # the last byte of block 1
    restarted = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    assert restarted.stats()[:3] == store.stats()[:3] and restarted.stats().corrupt == 0  # no block was read
    assert all(restarted.longest_prefix(c.hashes) == 3 for c in chains)
    assert [c.read(restarted) for c in chains] == [1, 3, 3, 3]  # the damage shows when read


def test_another_namespace_sees_nothing(tmp_path):
    chain = Chain(seed=1, blocks=3)
    chain.put(DiskStore(tmp_path, NS, BLOCK_BYTES, GIB))
    other_namespace = namespace_key("other-weights", "tokenizer-sha", "bfloat16", BLOCK_SIZE, "layout-1")
    other = DiskStore(tmp_path, other_namespace, BLOCK_BYTES, GIB)
    assert other.longest_prefix(chain.hashes) == 0 and other.stats().files == 0
    assert DiskStore(tmp_path, NS, BLOCK_BYTES, GIB).longest_prefix(chain.hashes) == 3


def test_a_flush_deletes_every_namespaces_chains_and_the_stores_find_nothing_after(tmp_path):
    """An admin's flush of the disk tier: the files go, of the namespaces open here and of any other
    (an older run's), and the open stores forget their blocks; what is not a chain file stays."""
    chain = Chain(seed=1, blocks=3)
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    chain.put(store)
    older = namespace_key("older-weights", "tokenizer-sha", "bfloat16", BLOCK_SIZE, "layout-1")
    Chain(seed=2, blocks=2, namespace=older).put(DiskStore(tmp_path, older, BLOCK_BYTES, GIB))
    (tmp_path / "notes.txt").write_text("not the tier's")
    assert remove_chains(tmp_path) == 2
    assert store.clear() == 3 and store.stats()[:3] == (0, 0, 0)
    assert chain.read(store) == 0 and store.longest_prefix(chain.hashes) == 0
    assert not list(tmp_path.rglob("*.kv")) and (tmp_path / "notes.txt").exists()
    assert chain.put(store) == 3 and chain.read(store) == 3  # the store writes on


def test_a_damaged_block_ends_the_read_before_it_and_removes_its_file(tmp_path):
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    chain = Chain(seed=2, blocks=8)
    chain.put(store, stop=4)
    chain.put(store, start=4)  # blocks 4..7 in a second file
    tail = store.directory / (chain.hashes[7].hex() + ".kv")
    flip_byte(tail, tail.stat().st_size - 2 * BLOCK_BYTES + 17)  # inside block 6, the file's third
    with capture_logs() as logs:
        assert chain.read(store) == 6  # blocks 0..5, right; never block 6
    assert not tail.exists() and store.stats().corrupt == 1
    assert [e["event"] for e in logs] == ["disk_tier_file_removed"]
    assert store.longest_prefix(chain.hashes) == 4 and chain.read(store) == 4  # the next read misses there
    assert chain.put(store) == 4  # and the tail can be written again


def test_reader_threads_bring_back_the_same_bytes_and_stop_at_the_same_damage(tmp_path):
    """Pieces of a chain read at once on a pool: the bytes, and the count where a block is damaged,
    are those of one thread's read."""
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    chain = Chain(seed=12, blocks=40)  # five pieces in the first file, and a second file
    chain.put(store, stop=30)
    chain.put(store, start=30)
    with ThreadPoolExecutor(4) as pool:
        out = [memoryview(bytearray(BLOCK_BYTES)) for _ in chain.hashes]
        assert store.read(chain.hashes, out, pool) == 40
        assert [bytes(o) for o in out] == [bytes(b) for b in chain.blocks]
        head = store.directory / (chain.hashes[29].hex() + ".kv")
        flip_byte(head, head.stat().st_size - 10 * BLOCK_BYTES + 5)  # inside block 20
        assert store.read(chain.hashes, out, pool) == 20
    assert not head.exists() and store.stats().corrupt == 1
    assert store.longest_prefix(chain.hashes) == 0  # the tail's file stays, without its head


def test_a_truncated_file_serves_its_whole_blocks_once_and_is_removed(tmp_path):
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    chain = Chain(seed=3, blocks=4)
    chain.put(store)
    (path,) = chain_files(store)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - BLOCK_BYTES - 100)  # block 2 half there, block 3 gone
    assert chain.read(store) == 2
    assert not path.exists() and store.longest_prefix(chain.hashes) == 0


def test_a_truncated_file_found_at_start_is_removed(tmp_path):
    chain = Chain(seed=3, blocks=4)
    chain.put(DiskStore(tmp_path, NS, BLOCK_BYTES, GIB))
    (path,) = (tmp_path / NS).iterdir()
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1)
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    assert store.stats().files == 0 and store.stats().corrupt == 1 and not path.exists()


def test_temp_files_and_garbage_are_removed_at_start(tmp_path):
    chain = Chain(seed=4, blocks=2)
    chain.put(DiskStore(tmp_path, NS, BLOCK_BYTES, GIB))
    directory = tmp_path / NS
    (good,) = directory.iterdir()
    leftover = directory / f".{good.name}.4242.deadbeef.tmp"  # a write killed before its rename
    leftover.write_bytes(good.read_bytes()[:5000])
    garbage = directory / (Chain(seed=5, blocks=1).hashes[0].hex() + ".kv")
    garbage.write_bytes(random.Random(0).randbytes(6000))
    renamed = directory / (Chain(seed=6, blocks=1).hashes[0].hex() + ".kv")  # a whole chain, misnamed
    renamed.write_bytes(good.read_bytes())
    with capture_logs() as logs:
        store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    assert sorted(directory.iterdir()) == [good]
    assert store.stats().corrupt == 2  # the garbage and the misnamed copy; a temp file is no damage
    assert logs[-1]["event"] == "disk_tier_indexed" and logs[-1]["removed"] == 3
    assert chain.read(store) == 2


def test_past_capacity_the_least_recently_used_files_go_first(tmp_path):
    one_file = 4096 + 2 * BLOCK_BYTES  # a page of header, then two blocks
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, capacity_bytes=3 * one_file)
    a, b, c, d, e = (Chain(seed, blocks=2) for seed in range(10, 15))
    for chain in (a, b, c):
        assert chain.put(store) == 2
    assert store.stats().bytes == 3 * one_file
    assert a.read(store) == 2  # a is now the most recently used
    d.put(store)
    assert [store.longest_prefix(x.hashes) for x in (a, b, c, d)] == [2, 0, 2, 2]
    e.put(store)
    assert [store.longest_prefix(x.hashes) for x in (a, c, d, e)] == [2, 0, 2, 2]
    assert len(chain_files(store)) == 3 and store.stats().bytes <= store.capacity_bytes


def test_a_chains_tail_is_evicted_before_its_head(tmp_path):
    one_file = 4096 + 2 * BLOCK_BYTES
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, capacity_bytes=3 * one_file)
    chain, other, newer = Chain(20, blocks=4), Chain(21, blocks=2), Chain(22, blocks=2)
    chain.put(store, stop=2)
    chain.put(store, start=2)  # the tail, written after its head, counts as used before it
    other.put(store)
    newer.put(store)  # evicts one file: the tail, though the head was written first
    assert store.longest_prefix(chain.hashes) == 2 and store.longest_prefix(other.hashes) == 2


def test_at_start_the_oldest_files_are_the_least_recently_used(tmp_path):
    one_file = 4096 + 2 * BLOCK_BYTES
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    chains = [Chain(seed, blocks=2) for seed in range(30, 33)]
    for age, chain in enumerate(chains):
        chain.put(store)
        mtime = 1_000_000 - age * 100  # the first written looks the newest
        os.utime(store.directory / (chain.hashes[-1].hex() + ".kv"), (mtime, mtime))
    smaller = DiskStore(tmp_path, NS, BLOCK_BYTES, capacity_bytes=2 * one_file)
    assert [smaller.longest_prefix(c.hashes) for c in chains] == [2, 2, 0]


def test_put_refuses_hashes_that_do_not_follow_from_the_tokens(tmp_path):
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    chain = Chain(seed=7, blocks=3)
    with pytest.raises(ValueError, match="hashes"):
        store.put(chain.hashes[1:], chain.token_ids[4:], chain.blocks[1:])  # the tail, without its parent
    with pytest.raises(ValueError, match=r"blocks\[0\]"):
        store.put(chain.hashes[:1], chain.token_ids[:4], [memoryview(b"short")])
    with pytest.raises(ValueError, match="namespace"):
        DiskStore(tmp_path, "../escape", BLOCK_BYTES, GIB)
    assert store.stats().files == 0


@pytest.fixture
def full_disk(tmp_path):
    with small_tmpfs(tmp_path / "tmpfs", "32k") as mount_point:
        yield mount_point


def test_a_full_disk_fails_writes_with_a_warning_and_reads_go_on(full_disk):
    store = DiskStore(full_disk, NS, 8192, GIB)  # the store's cap is far away: the disk is what fills
    first, second = (Chain(seed, blocks=2) for seed in (40, 41))
    for chain in (first, second):
        chain.blocks = [memoryview(random.Random(i).randbytes(8192)) for i in range(2)]
    assert first.put(store) == 2  # 20 KiB of 32
    with capture_logs() as logs:
        assert second.put(store) == 0
    assert [(e["event"], e["errno"]) for e in logs] == [("disk_tier_write_failed", "ENOSPC")]
    assert [p.name for p in full_disk.joinpath(NS).iterdir()] == [first.hashes[-1].hex() + ".kv"]  # no temp left
    out = [memoryview(bytearray(8192)) for _ in range(2)]
    assert store.read(first.hashes, out) == 2 and [bytes(o) for o in out] == [bytes(b) for b in first.blocks]
    assert store.longest_prefix(second.hashes) == 0
    assert store.clear() == 2
    assert second.put(store) == 2  # the next write, with room again, succeeds


def _write_chains(root: str, seeds: list[int], barrier, results) -> None:
    store = DiskStore(Path(root), NS, BLOCK_BYTES, GIB)
    barrier.wait()
    results.put([Chain(seed, blocks=6).put(store) for seed in seeds])


def test_two_processes_writing_the_same_chains_leave_one_whole_file_each(tmp_path):
    seeds = list(range(50, 70))
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    writers = [context.Process(target=_write_chains, args=(str(tmp_path), seeds, barrier, results)) for _ in range(2)]
    for writer in writers:
        writer.start()
    written = [results.get(timeout=60) for _ in writers]
    for writer in writers:
        writer.join(timeout=60)
        assert writer.exitcode == 0
    assert written == [[6] * len(seeds)] * 2  # both writes of every chain succeeded
    names = sorted(p.name for p in (tmp_path / NS).iterdir())
    assert names == sorted(Chain(seed, blocks=6).hashes[-1].hex() + ".kv" for seed in seeds)
    store = DiskStore(tmp_path, NS, BLOCK_BYTES, GIB)
    assert store.stats().corrupt == 0
    assert all(Chain(seed, blocks=6).read(store) == 6 for seed in seeds)
