"""The disk tier's chains shared through a JetStream object bucket, on a real nats-server: a chain
one machine's disk wrote comes back into another machine's disk and reads byte for byte; a damaged
copy costs a shorter hit, never wrong bytes; a bucket past its size deletes the chains put longest
ago; another server's puts are found once the bucket is listed again."""

from actors.cache_tier.disk_store import DiskStore
from actors.cache_tier.shared_chains import SharedChains
from kernel.bus import Bus
from tests.cache_tier.test_disk_store import BLOCK_BYTES, GIB, NS, Chain


async def shared(bus: Bus, capacity_bytes: int = 1 << 20) -> SharedChains:
    chains = SharedChains(await bus.object_bucket("kv-chains-test", capacity_bytes), capacity_bytes)
    await chains.refresh()
    return chains


async def put_all(chains: SharedChains, store: DiskStore, hashes: list[bytes]) -> None:
    for name, held in store.files_of(hashes).items():
        await chains.put(NS, store.directory / name, held)


async def bring(chains: SharedChains, store: DiskStore) -> None:
    """What the cache_tier's pull does: every object of the namespace, latest first, into the disk."""
    for name, _, _ in chains.newest_first(NS):
        assert store.adopt(await chains.get(name, store.directory))


def three_chains_on_disk(tmp_path) -> tuple[DiskStore, list[Chain], list[int]]:
    """A disk holding three chains of 8 blocks, and each chain's files' bytes."""
    here = DiskStore(tmp_path / "here", NS, BLOCK_BYTES, GIB)
    chains = [Chain(seed, 8) for seed in range(3)]
    for chain in chains:
        chain.put(here)
    sizes = [sum((here.directory / n).stat().st_size for n in here.files_of(c.hashes)) for c in chains]
    return here, chains, sizes


async def test_a_chain_written_on_one_machine_reads_back_on_another(buses, tmp_path):
    here = DiskStore(tmp_path / "here", NS, BLOCK_BYTES, GIB)
    chain = Chain(1, 12)
    chain.put(here, 0, 5)
    chain.put(here, 5, 12)  # two files
    await put_all(await shared(buses[0]), here, chain.hashes)

    there = DiskStore(tmp_path / "there", NS, BLOCK_BYTES, GIB)
    elsewhere = await shared(buses[1])  # another server, listing the bucket at its start
    assert sorted(elsewhere.hashes(NS)) == sorted(chain.hashes)
    await bring(elsewhere, there)
    assert chain.read(there) == 12
    assert DiskStore(tmp_path / "there", NS, BLOCK_BYTES, GIB).held_prefix(chain.hashes) == 12  # files, kept


async def test_a_damaged_copy_is_a_shorter_hit_never_wrong_bytes(buses, tmp_path):
    here = DiskStore(tmp_path / "here", NS, BLOCK_BYTES, GIB)
    chain = Chain(2, 6)
    chain.put(here)
    (name,) = here.files_of(chain.hashes)
    data = bytearray((here.directory / name).read_bytes())
    data[-BLOCK_BYTES * 2 + 5] ^= 0xFF  # in block 4 of 6
    (tmp_path / name).write_bytes(bytes(data))
    chains = await shared(buses[0])
    await chains.put(NS, tmp_path / name, chain.hashes)  # damaged before it went in

    there = DiskStore(tmp_path / "there", NS, BLOCK_BYTES, GIB)
    await bring(await shared(buses[1]), there)
    assert chain.read(there) == 4
    assert there.stats().corrupt == 1


async def test_a_full_bucket_deletes_the_chains_put_longest_ago(buses, tmp_path):
    here, chains, sizes = three_chains_on_disk(tmp_path)
    bucket = await shared(buses[0], capacity_bytes=sizes[0] + sizes[1] + sizes[2] // 2)
    for chain in chains:
        await put_all(bucket, here, chain.hashes)
    listed = await shared(buses[1], capacity_bytes=GIB)
    assert set(listed.hashes(NS)) == set(chains[1].hashes + chains[2].hashes)


async def test_a_put_makes_room_from_objects_another_server_put_since_it_listed(buses, tmp_path):
    here, chains, sizes = three_chains_on_disk(tmp_path)
    capacity = sizes[0] + sizes[1] + sizes[2] // 2
    late = await shared(buses[1], capacity_bytes=capacity)  # lists the bucket while it is empty
    early = await shared(buses[0], capacity_bytes=capacity)
    for chain in chains[:2]:
        await put_all(early, here, chain.hashes)
    await put_all(late, here, chains[2].hashes)  # the bucket is full of objects `late` never listed
    listed = await shared(buses[0], capacity_bytes=GIB)
    assert set(listed.hashes(NS)) == set(chains[1].hashes + chains[2].hashes)
