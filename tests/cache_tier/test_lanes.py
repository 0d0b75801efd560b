"""The cache_tier actor on a real nats-server serves reads and writes in two lanes: a fetch, which a
prompt waits for, is answered while a spill is still being written; a flush waits for both lanes
and both wait for it. A slow disk is stood in for by a write that sleeps."""

import argparse
import asyncio
import time
import uuid

import pytest

from actors.cache_tier import chain_file
from actors.cache_tier.actor import CacheTierActor
from actors.cache_tier.host_segment import HostSegment
from actors.lib.block_hashes import extend_hashes, root_hash
from kernel.bus import Bus
from kernel.config import BusConfig, EngineConfig, KernelConfig, SupervisionConfig
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
from schemas.health import Heartbeat

NAMESPACE, BLOCK_SIZE, SLOT_BYTES, SLOW_WRITE_S = "a" * 32, 4, 4096, 1.0


@pytest.fixture
async def cache_tier(nats_url, tmp_path):
    """(the scheduler's bus, the segment): a cache_tier actor serving a disk dir under tmp_path."""
    engine = EngineConfig(disk_kv_gb=1.0, disk_kv_dir=str(tmp_path / "disk"))
    config = KernelConfig(
        bus=BusConfig(nats_url=nats_url), engine=engine, supervision=SupervisionConfig(data_dir=str(tmp_path))
    )
    segment = HostSegment.create(f"test-lanes-{uuid.uuid4().hex[:12]}", 8, SLOT_BYTES)
    scheduler = await Bus.connect(nats_url, "scheduler")
    started = asyncio.Event()

    async def on_heartbeat(_beat: Heartbeat, _reply_to) -> None:
        started.set()  # the first beat follows `start`, which subscribed

    await scheduler.subscribe(Subjects().heartbeat("cache_tier"), Heartbeat, on_heartbeat)
    actor = CacheTierActor(config, await Bus.connect(nats_url, "cache_tier"), argparse.Namespace())
    stop = asyncio.Event()
    running = asyncio.create_task(actor.run_until_stopped(stop))
    try:
        await asyncio.wait_for(started.wait(), 30)
        yield scheduler, segment
    finally:
        stop.set()
        await running
        await scheduler.close()
        segment.close()
        segment.unlink()


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
