"""The snapshot actor's sessions in a JetStream key-value bucket of a real nats-server: the same
behaviour as the files (saved sessions come back in pages, expired ones and unreadable values are
deleted, never served), one bucket per bus namespace, and the files where JetStream is missing."""

import asyncio
import time

import pytest
import structlog

from actors.snapshot.kv_session_store import KeyValueSessionStore
from actors.snapshot.session_store import DIGEST_BYTES, MAGIC, SessionStore, encode_file
from actors.snapshot.stores import FileSessionStorage, open_storage
from kernel import bus_auth
from kernel.bus import Bus
from kernel.bus_jetstream import JetStreamUnavailable
from kernel.config import BusConfig, KernelConfig, SupervisionConfig
from kernel.nats_server import EmbeddedNats, find_binary, free_port
from kernel.subjects import Subjects
from tests.actors.test_session_store import NOW, record


@pytest.fixture
async def bus(nats_url):
    connected = await Bus.connect(nats_url, "snapshot")
    yield connected
    await connected.close()


async def store(bus: Bus, namespace: str = "llm", now: float = NOW) -> KeyValueSessionStore:
    return KeyValueSessionStore(await bus.key_value(Subjects(namespace).sessions_bucket), clock=lambda: now)


async def restore_all(sessions: KeyValueSessionStore, limit_bytes: int = 1 << 20) -> list:
    records, after = [], ""
    while True:
        page, complete = await sessions.restore(after, limit_bytes)
        records += page
        if complete:
            return records
        after = page[-1].session_id


async def test_a_saved_session_comes_back_as_saved_and_a_dropped_one_does_not(bus):
    sessions = await store(bus)
    for session_id in ("b", "a", "c"):
        assert await sessions.save(record(session_id))
    assert await sessions.save(record("a", last_used=NOW - 5, tokens=3))  # replaces the first
    assert await sessions.drop("c") and not await sessions.drop("c")
    assert await restore_all(await store(bus)) == [record("a", last_used=NOW - 5, tokens=3), record("b")]
    assert await sessions.bucket.get("c") is None


async def test_sessions_come_in_pages_that_fit_the_limit(bus):
    sessions = await store(bus)
    for i in range(10):
        await sessions.save(record(f"s{i}", tokens=50))
    size = len(encode_file(record("s0", tokens=50))) - len(MAGIC) - DIGEST_BYTES
    page, complete = await sessions.restore("", 3 * size)
    assert [r.session_id for r in page] == ["s0", "s1", "s2"] and not complete
    assert [r.session_id for r in await restore_all(sessions, 3 * size)] == [f"s{i}" for i in range(10)]


async def test_an_expired_session_is_deleted_not_restored(bus):
    sessions = await store(bus)
    await sessions.save(record("old", last_used=NOW - 601))
    await sessions.save(record("recent", last_used=NOW - 599))
    assert [r.session_id for r in await restore_all(sessions)] == ["recent"]
    assert await sessions.bucket.get("old") is None


async def test_an_unreadable_value_is_deleted_and_the_others_restore(bus):
    sessions = await store(bus)
    for session_id in ("flipped", "good", "truncated", "moved"):
        await sessions.save(record(session_id))
    flipped = bytearray(await sessions.bucket.get("flipped"))
    flipped[-3] ^= 0x01  # one bit of a token id, which would still decode
    await sessions.bucket.put("flipped", bytes(flipped))
    truncated = await sessions.bucket.get("truncated")
    await sessions.bucket.put("truncated", truncated[: len(truncated) // 2])
    await sessions.bucket.put("renamed", await sessions.bucket.get("moved"))  # holds another id than its key
    await sessions.bucket.delete("moved")
    await sessions.bucket.put("junk", b"not a session at all")

    with structlog.testing.capture_logs() as logs:
        assert await restore_all(await store(bus)) == [record("good")]
    assert [key for key in await sessions.bucket.keys() if await sessions.bucket.get(key) is not None] == ["good"]
    unreadable = sorted(e["session_id"] for e in logs if e["event"] == "session_value_unreadable")
    assert unreadable == ["flipped", "junk", "renamed", "truncated"]


async def test_keep_only_drops_every_other_session(bus):
    sessions = await store(bus)
    for session_id in ("a", "b", "c"):
        await sessions.save(record(session_id))
    assert await sessions.keep_only(["b", "z"]) == ["a", "c"]
    assert [r.session_id for r in await restore_all(sessions)] == ["b"]
    await sessions.save(record("d"))
    assert await sessions.keep_only(["d"]) == ["b"]  # not a, c: deleted before (their markers are listed)


async def test_a_value_the_bucket_refuses_is_reported_and_the_older_record_goes(bus):
    sessions = await store(bus)
    await sessions.save(record("a"))
    assert not await sessions.save(record("a", tokens=bus.max_payload_bytes))  # over the server's max_payload
    assert await restore_all(sessions) == []  # not the older record, which lacks the latest turns


async def test_namespaces_on_one_server_never_mix_and_one_namespace_shares(bus, nats_url):
    ours, theirs = await store(bus, "llm"), await store(bus, "llm_b")
    await ours.save(record("a"))
    await theirs.save(record("b"))
    other_machine = await Bus.connect(nats_url, "snapshot")
    try:
        assert await restore_all(await store(other_machine, "llm")) == [record("a")]
        assert await restore_all(await store(other_machine, "llm.b")) == []
    finally:
        await other_machine.close()


async def test_the_snapshot_user_of_a_server_with_users_may_use_its_bucket(tmp_path):
    """`--session-store jetstream` under the embedded server, whose users may publish only what
    kernel/bus_grants.py grants them."""
    server = EmbeddedNats(tmp_path, config_file=bus_auth.prepare(tmp_path, "llm"))
    await server.start()
    credentials = bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, "snapshot"))
    snapshot = await Bus.connect(server.url, "snapshot", credentials)
    try:
        sessions = await store(snapshot)
        assert await sessions.save(record("a")) and await sessions.save(record("b"))
        assert await sessions.drop("a") and await sessions.keep_only([]) == ["b"]
        assert await restore_all(sessions) == []
    finally:
        await snapshot.close()
        await server.stop()


async def test_the_store_is_the_bucket_with_jetstream_and_the_files_without(bus, nats_url, tmp_path):
    config = KernelConfig(bus=BusConfig(nats_url=nats_url), supervision=SupervisionConfig(data_dir=str(tmp_path)))
    assert isinstance(await open_storage(config, bus), KeyValueSessionStore)
    port = free_port()
    plain = await asyncio.create_subprocess_exec(find_binary(), "-a", "127.0.0.1", "-p", str(port))  # no -js
    try:
        await listening(port)
        without = await Bus.connect(f"nats://127.0.0.1:{port}", "snapshot")
        with pytest.raises(JetStreamUnavailable):
            await without.key_value("sessions")
        storage = await open_storage(config, without)
        assert isinstance(storage, FileSessionStorage)
        assert await storage.save(record("a")) and (tmp_path / "sessions" / "a.session").exists()
        await without.close()
    finally:
        plain.terminate()
        await plain.wait()


async def listening(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise TimeoutError(f"nats-server did not listen on port {port}")


async def test_sessions_saved_in_files_move_into_an_empty_bucket_once(bus, nats_url, tmp_path):
    """A server that kept its sessions in files, started on a NATS with JetStream: they go into the
    bucket (and leave the files), so none is lost and none comes back stale later."""
    now = time.time()
    SessionStore(tmp_path / "sessions").save(record("old", last_used=now))
    bus_config = BusConfig(nats_url=nats_url, namespace="moved")
    config = KernelConfig(bus=bus_config, supervision=SupervisionConfig(data_dir=str(tmp_path)))
    storage = await open_storage(config, bus)
    assert [r.session_id for r in await restore_all(storage)] == ["old"]
    assert not list((tmp_path / "sessions").glob("*.session"))
    SessionStore(tmp_path / "sessions").save(record("later", last_used=now))  # the bucket has some: not moved
    storage = await open_storage(config, bus)
    assert [r.session_id for r in await restore_all(storage)] == ["old"]
