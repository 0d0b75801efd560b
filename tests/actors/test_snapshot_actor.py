"""The snapshot actor on a real nats-server: it takes the scheduler's changes in the order sent, so
a restore asked right after a burst of saves and drops sees every one of them, in files or in the
server's JetStream alike."""

import argparse
import asyncio
import time

import pytest

from actors.snapshot.actor import SnapshotActor
from kernel.bus import Bus
from kernel.config import BusConfig, KernelConfig, SupervisionConfig
from kernel.subjects import Subjects
from schemas.health import Heartbeat
from schemas.requests import Tenant
from schemas.snapshot import (
    DropSession,
    RestoreSessions,
    SaveSession,
    SessionRecord,
    SessionsHeld,
    SessionsRestored,
    TurnRecord,
)


def record(i: int, last_used: float) -> SessionRecord:
    return SessionRecord(f"s{i:03}", Tenant(), 64, 600.0, last_used, [TurnRecord("t", None, 0, list(range(i)))])


@pytest.mark.parametrize("session_store", ["files", "jetstream"])
async def test_a_restore_sees_every_change_sent_before_it(nats_url, tmp_path, session_store):
    supervision = SupervisionConfig(data_dir=str(tmp_path), session_store=session_store)
    config = KernelConfig(bus=BusConfig(nats_url=nats_url), supervision=supervision)
    actor_bus = await Bus.connect(nats_url, "snapshot")
    scheduler = await Bus.connect(nats_url, "scheduler")
    started = asyncio.Event()

    async def on_heartbeat(_beat: Heartbeat, _reply_to) -> None:
        started.set()  # the first beat follows `start`, which subscribed

    subjects = Subjects()
    await scheduler.subscribe(subjects.heartbeat("snapshot"), Heartbeat, on_heartbeat)
    actor = SnapshotActor(config, actor_bus, argparse.Namespace())
    stop = asyncio.Event()
    running = asyncio.create_task(actor.run_until_stopped(stop))
    subject = subjects.snapshot_sessions
    try:
        await asyncio.wait_for(started.wait(), 30)
        records = [record(i, time.time()) for i in range(60)]
        for r in records:
            await scheduler.publish(subject, SaveSession(r))
        for i in range(0, 60, 3):
            await scheduler.publish(subject, DropSession(f"s{i:03}"))
        await scheduler.publish(subject, SessionsHeld([f"s{i:03}" for i in range(30)]))
        reply = await scheduler.request(subject, RestoreSessions(), SessionsRestored, 30)
        assert isinstance(reply, SessionsRestored) and reply.complete
        assert reply.records == [r for i, r in enumerate(records) if i % 3 and i < 30]
        assert reply.snapshot_id == actor.instance_id
        assert any((tmp_path / "sessions").glob("*.session")) == (session_store == "files")
    finally:
        stop.set()
        await running
        await actor_bus.close()
        await scheduler.close()
