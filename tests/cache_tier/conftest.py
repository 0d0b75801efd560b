"""Fixtures of the cache_tier's tests, on a real nats-server (tests/conftest.py's `nats_url`)."""

import argparse
import asyncio
import uuid

import pytest

from actors.cache_tier.actor import CacheTierActor
from actors.cache_tier.host_segment import HostSegment
from kernel.bus import Bus
from kernel.config import BusConfig, EngineConfig, KernelConfig, SupervisionConfig
from kernel.subjects import Subjects
from schemas.health import Heartbeat

SLOT_BYTES = 4096  # of the `cache_tier` fixture's segment


@pytest.fixture
async def buses(nats_url):
    connected = [await Bus.connect(nats_url, "cache_tier") for _ in range(2)]
    yield connected
    for bus in connected:
        await bus.close()


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
    actor_bus = await Bus.connect(nats_url, "cache_tier")
    actor = CacheTierActor(config, actor_bus, argparse.Namespace())
    stop = asyncio.Event()
    running = asyncio.create_task(actor.run_until_stopped(stop))
    try:
        await asyncio.wait_for(started.wait(), 30)
        yield scheduler, segment
    finally:
        stop.set()
        await running
        await actor_bus.close()  # else it reconnects for ever to the test's stopped nats-server
        await scheduler.close()
        segment.close()
        segment.unlink()
