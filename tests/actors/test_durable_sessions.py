"""The scheduler's side of durable sessions on a real nats-server, with a real snapshot actor that
comes up late: a turn asked while the sessions are being restored waits for them, and gets the
saved conversation rather than not_found; a session opened afterwards reaches the disk."""

import argparse
import asyncio
import time

import structlog

from actors.scheduler.durable_sessions import DurableSessions
from actors.snapshot.actor import SnapshotActor
from actors.snapshot.session_store import SessionStore
from actors.snapshot.stores import SESSIONS_DIR
from kernel.bus import Bus
from kernel.config import BusConfig, KernelConfig, SupervisionConfig
from kernel.subjects import Subjects
from schemas.session import BeginTurn, OpenSession, SessionOpened, TurnTokens
from schemas.snapshot import SaveSession, SessionRecord, SessionsHeld, TurnRecord
from tests.actors.test_sessions import ALICE, make


async def test_a_turn_asked_while_restoring_waits_for_the_saved_session(nats_url, tmp_path):
    tokens = list(range(100, 130))
    saved = SessionRecord("s1", ALICE, 64, 600.0, time.time(), [TurnRecord("t1", None, 0, tokens)])
    SessionStore(tmp_path / SESSIONS_DIR).save(saved)
    _, _, table, _ = make()
    scheduler_bus = await Bus.connect(nats_url, "scheduler")
    durable = DurableSessions(scheduler_bus, Subjects(), structlog.get_logger())
    restoring = asyncio.create_task(durable.restore(table))
    begun = asyncio.create_task(durable.answer(table, BeginTurn("s1", ALICE, "t2"), ALICE))
    await asyncio.sleep(0.5)
    assert not begun.done() and not restoring.done()  # no snapshot actor yet: the restore asks again

    supervision = SupervisionConfig(data_dir=str(tmp_path), session_store="files")
    config = KernelConfig(bus=BusConfig(nats_url=nats_url), supervision=supervision)
    snapshot_bus = await Bus.connect(nats_url, "snapshot")
    snapshot = SnapshotActor(config, snapshot_bus, argparse.Namespace())
    stop = asyncio.Event()
    running = asyncio.create_task(snapshot.run_until_stopped(stop))
    try:
        assert await asyncio.wait_for(begun, 30) == TurnTokens("s1", "t1", tokens)
        await restoring
        opened = await durable.answer(table, OpenSession(), ALICE)
        assert isinstance(opened, SessionOpened)
        path = tmp_path / SESSIONS_DIR / f"{opened.session_id}.session"
        for _ in range(300):
            if path.exists():
                break
            await asyncio.sleep(0.01)
        assert path.exists()
    finally:
        stop.set()
        await running
        await snapshot_bus.close()
        await scheduler_bus.close()


async def test_after_a_restore_that_read_nothing_no_saved_session_is_dropped(nats_url, monkeypatch):
    """The snapshot actor did not answer in time: the scheduler serves on without the saved
    sessions, and later tells a snapshot actor of its own sessions, never that it holds only them
    (which would delete every saved session it never read)."""
    monkeypatch.setattr("actors.scheduler.durable_sessions.RESTORE_DEADLINE_S", 0.3)
    _, _, table, _ = make()
    bus = await Bus.connect(nats_url, "scheduler")
    heard: list = []
    listener = await Bus.connect(nats_url, "snapshot-listener")
    await listener.subscribe(Subjects().snapshot_sessions, SessionsHeld | SaveSession, lambda m, _r: _note(heard, m))
    durable = DurableSessions(bus, Subjects(), structlog.get_logger())
    try:
        await durable.restore(table)  # nothing answers
        assert isinstance(await durable.answer(table, OpenSession(), ALICE), SessionOpened)
        await durable.send_all(table)
        await bus.flush()
        await asyncio.sleep(0.2)
        assert heard and not any(isinstance(m, SessionsHeld) for m in heard)
    finally:
        await listener.close()
        await bus.close()


async def _note(heard: list, message) -> None:
    heard.append(message)
