"""The cache_tier actor on a real nats-server serves reads and writes in two lanes: a fetch, which a
prompt waits for, is answered while a spill is still being written; a flush waits for both lanes
and both wait for it. A slow disk is stood in for by a write that sleeps."""

import asyncio
import time

from actors.cache_tier import chain_file
from actors.cache_tier.host_segment import HostSegment
from actors.lib.block_hashes import extend_hashes, root_hash
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.cache import (
    BlocksFetched,
    BlocksSpilled,
    CacheTierReply,
    DiskFlushed,
    FetchBlocks,
    FlushDisk,
    SpillBlocks,
)

NAMESPACE, BLOCK_SIZE, SLOW_WRITE_S = "a" * 32, 4, 1.0


def spill(segment: HostSegment, slots: list[int], first_token: int) -> SpillBlocks:
    """A chain of one block a slot, each slot filled with its own byte."""
    tokens = list(range(first_token, first_token + BLOCK_SIZE * len(slots)))
    hashes = extend_hashes(root_hash(NAMESPACE), tokens, BLOCK_SIZE)
    for slot in slots:
        segment.slots()[slot].fill(slot + 1)
    return SpillBlocks(segment.name, NAMESPACE, slots, hashes, [None, *hashes[:-1]], tokens)


async def ask(bus: Bus, request) -> tuple[CacheTierReply, float]:
    reply = await bus.request(Subjects().cache_tier, request, CacheTierReply, 30)
    return reply, time.monotonic()


def slow_disk(monkeypatch) -> None:
    write = chain_file.write_chain

    def slow_write(*args, **kwargs):
        time.sleep(SLOW_WRITE_S)
        return write(*args, **kwargs)

    monkeypatch.setattr(chain_file, "write_chain", slow_write)


async def test_a_fetch_is_answered_while_a_spill_is_being_written(cache_tier, monkeypatch):
    bus, segment = cache_tier
    stored = spill(segment, [0, 1], first_token=0)
    first, _ = await ask(bus, stored)
    assert isinstance(first, BlocksSpilled) and first.stored == stored.hashes
    slow_disk(monkeypatch)
    started = time.monotonic()
    writing = asyncio.create_task(ask(bus, spill(segment, [2, 3], first_token=1000)))
    await asyncio.sleep(0.1)  # the spill is being written
    fetched, fetched_at = await ask(bus, FetchBlocks(segment.name, NAMESPACE, [4, 5], stored.hashes))
    assert fetched == BlocksFetched(2, fetched.figures)
    assert (segment.slots()[4] == 1).all() and (segment.slots()[5] == 2).all()
    spilled, spilled_at = await writing
    assert isinstance(spilled, BlocksSpilled) and len(spilled.stored) == 2
    assert fetched_at - started < SLOW_WRITE_S <= spilled_at - started


async def test_a_flush_waits_for_the_spill_before_it_and_a_fetch_after_it_waits_for_the_flush(cache_tier, monkeypatch):
    bus, segment = cache_tier
    slow_disk(monkeypatch)
    request = spill(segment, [0, 1], first_token=0)
    writing = asyncio.create_task(ask(bus, request))
    await asyncio.sleep(0.1)
    flushing = asyncio.create_task(ask(bus, FlushDisk()))
    await asyncio.sleep(0.1)
    fetched, fetched_at = await ask(bus, FetchBlocks(segment.name, NAMESPACE, [4, 5], request.hashes))
    (spilled, spilled_at), (flushed, flushed_at) = await writing, await flushing
    assert isinstance(spilled, BlocksSpilled) and len(spilled.stored) == 2
    assert flushed == DiskFlushed(blocks=2, files=1)  # the two blocks follow one another: one chain file
    assert fetched == BlocksFetched(0, fetched.figures)  # the spill's blocks went with the flush
    assert spilled_at <= flushed_at <= fetched_at
