"""The snapshot actor's files on their own: saved sessions come back in pages, expired ones are
deleted, unreadable ones set aside without costing the others, and what a crash mid-write leaves
is cleaned up."""

import hashlib
import shutil

import msgspec

from actors.snapshot.session_store import DIGEST_BYTES, MAGIC, UNREADABLE_DIR, SessionStore, decode_file, encode_file
from schemas.requests import Tenant
from schemas.snapshot import SessionRecord, TurnRecord

NOW = 1_800_000_000.0


def record(session_id: str, last_used: float = NOW, idle_timeout_s: float = 600.0, tokens: int = 8) -> SessionRecord:
    turns = [TurnRecord("t1", None, 0, list(range(tokens))), TurnRecord("t2", "t1", tokens, [7, 8])]
    return SessionRecord(session_id, Tenant("alice"), 256, idle_timeout_s, last_used, turns)


def store(tmp_path, now: float = NOW) -> SessionStore:
    return SessionStore(tmp_path / "sessions", clock=lambda: now)


def restore_all(sessions: SessionStore, limit_bytes: int = 1 << 20) -> list[SessionRecord]:
    records, after = [], ""
    while True:
        page, complete = sessions.restore(after, limit_bytes)
        records += page
        if complete:
            return records
        after = page[-1].session_id


def test_a_saved_session_comes_back_as_saved_and_a_dropped_one_does_not(tmp_path):
    sessions = store(tmp_path)
    for session_id in ("b", "a", "c"):
        assert sessions.save(record(session_id))
    assert sessions.save(record("a", last_used=NOW - 5, tokens=3))  # replaces the first
    assert sessions.drop("c") and not sessions.drop("c")
    assert restore_all(store(tmp_path)) == [record("a", last_used=NOW - 5, tokens=3), record("b")]
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["a.session", "b.session"]


def test_sessions_come_in_pages_that_fit_the_limit(tmp_path):
    sessions = store(tmp_path)
    for i in range(10):
        sessions.save(record(f"s{i}", tokens=50))
    size = len(encode_file(record("s0", tokens=50))) - len(MAGIC) - 16
    page, complete = sessions.restore("", 3 * size)
    assert [r.session_id for r in page] == ["s0", "s1", "s2"] and not complete
    assert [r.session_id for r in restore_all(sessions, 3 * size)] == [f"s{i}" for i in range(10)]


def test_an_expired_session_is_deleted_not_restored(tmp_path):
    sessions = store(tmp_path)
    sessions.save(record("old", last_used=NOW - 601))
    sessions.save(record("recent", last_used=NOW - 599))
    assert [r.session_id for r in restore_all(sessions)] == ["recent"]
    assert not (tmp_path / "sessions" / "old.session").exists()


def test_an_unreadable_file_is_set_aside_and_the_others_restore(tmp_path):
    sessions = store(tmp_path)
    for session_id in ("flipped", "good", "truncated", "moved"):
        sessions.save(record(session_id))
    folder = tmp_path / "sessions"
    flipped = bytearray((folder / "flipped.session").read_bytes())
    flipped[-3] ^= 0x01  # one bit of a token id, which would still decode
    (folder / "flipped.session").write_bytes(bytes(flipped))
    truncated = (folder / "truncated.session").read_bytes()
    (folder / "truncated.session").write_bytes(truncated[: len(truncated) // 2])
    shutil.move(folder / "moved.session", folder / "renamed.session")  # holds another id than its name
    (folder / "junk.session").write_bytes(b"not a session at all")

    assert restore_all(store(tmp_path)) == [record("good")]
    aside = sorted(p.name.split(".")[0] for p in (folder / UNREADABLE_DIR).iterdir())
    assert aside == ["flipped", "junk", "renamed", "truncated"]
    assert sorted(p.name for p in folder.glob("*.session")) == ["good.session"]


def test_what_a_crash_mid_write_leaves_is_removed_and_the_old_record_stands(tmp_path):
    sessions = store(tmp_path)
    sessions.save(record("a"))
    (tmp_path / "sessions" / "a.session.partial").write_bytes(encode_file(record("a", tokens=2))[:20])
    reopened = store(tmp_path)
    assert not list((tmp_path / "sessions").glob("*.partial"))
    assert restore_all(reopened) == [record("a")]


def test_keep_only_drops_every_other_session(tmp_path):
    sessions = store(tmp_path)
    for session_id in ("a", "b", "c"):
        sessions.save(record(session_id))
    assert sessions.keep_only(["b", "z"]) == ["a", "c"]
    assert [r.session_id for r in restore_all(sessions)] == ["b"]


def test_a_write_the_disk_refuses_is_reported_and_the_older_record_goes(tmp_path):
    sessions = store(tmp_path)
    sessions.save(record("a"))
    # The temporary file cannot be made: it is a link into a folder that does not exist.
    (tmp_path / "sessions" / "a.session.partial").symlink_to(tmp_path / "gone" / "a")
    assert not sessions.save(record("a", tokens=20))
    assert restore_all(sessions) == []  # not the older record, which lacks the latest turns
    assert sessions.save(record("a", tokens=20))  # the disk takes writes again
    assert restore_all(sessions) == [record("a", tokens=20)]


class TurnRecordOfANewerBuild(msgspec.Struct, frozen=True):
    turn_id: str
    parent: str | None
    shared_tokens: int
    token_ids: list[int]
    speculative_draft: list[int] = []  # a field this build does not know


def test_a_record_of_a_newer_build_reads_without_the_fields_it_added(tmp_path):
    newer = {**msgspec.structs.asdict(record("a")), "turns": [TurnRecordOfANewerBuild("t1", None, 0, [1, 2], [3])]}
    body = msgspec.msgpack.encode(newer)
    data = MAGIC + hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest() + body
    assert decode_file(data).turns == [TurnRecord("t1", None, 0, [1, 2])]
