"""The cache_tier's bucket lane on a real nats-server: its puts and pulls wait while a fetch is read
(a prompt waits for that fetch), and not longer than HOLD_S; after a start it sweeps the chunks of
puts that a kill cut short."""

import asyncio
import os
import time

import nats
import structlog

from actors.cache_tier import shared_chains
from actors.cache_tier.bucket_lane import HOLD_S, BucketLane
from actors.cache_tier.disk_store import DiskStore
from tests.cache_tier.test_disk_store import BLOCK_BYTES, GIB, NS, Chain
from tests.cache_tier.test_shared_chains import shared


async def objects_in_bucket(bus) -> int:
    return (await shared(bus)).objects_held


async def eventually(check, timeout_s: float = 10.0) -> float:
    """Seconds until `check()` (a coroutine function) is true."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < timeout_s, "not within the timeout"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def lane_on(store: DiskStore, chains) -> BucketLane:
    return BucketLane(chains, {NS: store}.get, GIB, structlog.get_logger())


async def test_puts_and_pulls_wait_for_the_fetch_being_read(buses, tmp_path):
    here = DiskStore(tmp_path / "here", NS, BLOCK_BYTES, GIB)
    chain = Chain(3, 8)
    chain.put(here)
    lane = lane_on(here, await shared(buses[0]))
    lane.fetch_started()
    lane.queue_puts(NS, chain.hashes)
    await asyncio.sleep(HOLD_S / 2)
    assert await objects_in_bucket(buses[1]) == 0
    lane.fetch_done()
    await eventually(lambda: objects_in_bucket(buses[1]))

    there = DiskStore(tmp_path / "there", NS, BLOCK_BYTES, GIB)
    lane = lane_on(there, await shared(buses[1]))
    lane.fetch_started()
    lane.queue_pulls(NS)
    await asyncio.sleep(HOLD_S / 2)
    assert there.held_prefix(chain.hashes) == 0
    lane.fetch_done()

    async def pulled() -> bool:
        return there.held_prefix(chain.hashes) == 8

    await eventually(pulled)
    assert chain.read(there) == 8


async def test_a_fetch_holds_the_puts_no_longer_than_hold_s(buses, tmp_path):
    here = DiskStore(tmp_path / "here", NS, BLOCK_BYTES, GIB)
    chain = Chain(4, 8)
    chain.put(here)
    lane = lane_on(here, await shared(buses[0]))
    lane.fetch_started()  # and never done
    lane.queue_puts(NS, chain.hashes)
    waited = await eventually(lambda: objects_in_bucket(buses[1]))
    assert HOLD_S * 0.8 <= waited < HOLD_S + 3.0  # held, then put (the margin: a loaded CI machine)


async def test_after_a_start_the_lane_sweeps_the_chunks_of_a_put_a_kill_cut_short(
    buses, nats_url, tmp_path, monkeypatch
):
    monkeypatch.setattr(shared_chains, "ORPHAN_CHUNKS_AGE_S", 0.0)
    chains = await shared(buses[0])
    killed = await nats.connect(nats_url)
    await killed.jetstream().publish("$O.kv-chains-test.C.cutshort", os.urandom(5000))
    await killed.close()
    (tmp_path / "later").write_bytes(b"a later put")
    await chains.bucket.put_file("ns/later.kv", tmp_path / "later")  # the stream's clock goes on
    lane = lane_on(DiskStore(tmp_path / "here", NS, BLOCK_BYTES, GIB), chains)
    lane.sweep_later()

    async def swept() -> bool:
        return await chains.bucket.used_bytes() < 5000

    await eventually(swept)
