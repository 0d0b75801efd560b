"""The snapshot actor's files: one per session under `<data_dir>/sessions/`, each replaced whole
and atomically, read back when a scheduler starts. Plain blocking I/O: the actor calls it off its
event loop.

A file is `MAGIC`, a 16-byte blake2b digest of the body, and the body: the `SessionRecord` in
msgpack. A write goes to a temporary file, is fsynced, renamed over the old one, and the folder is
fsynced, so a crash at any point leaves the old record or the new one, never half of either. A file
that does not read back (a bad digest, a body that does not decode, bytes flipped on the disk) is
moved into `unreadable/` and logged: one bad file never costs the other sessions.
"""

import hashlib
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path

import msgspec
import structlog

from schemas.snapshot import SessionRecord

MAGIC = b"llm-session\x01"  # the last byte is the format's version
DIGEST_BYTES = 16
SUFFIX = ".session"
PARTIAL_SUFFIX = ".partial"  # a write not renamed yet: what a crash mid-write leaves
UNREADABLE_DIR = "unreadable"

log = structlog.get_logger()


class Unreadable(Exception):
    """A session file whose bytes are not a record this store wrote."""


def encode_file(record: SessionRecord) -> bytes:
    body = msgspec.msgpack.encode(record)
    return MAGIC + hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest() + body


def decode_file(data: bytes) -> SessionRecord:
    header = len(MAGIC) + DIGEST_BYTES
    if len(data) < header or not data.startswith(MAGIC):
        raise Unreadable("not a session file of this format (its header)")
    digest, body = data[len(MAGIC) : header], data[header:]
    if hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest() != digest:
        raise Unreadable("its digest does not match its bytes")
    try:
        return msgspec.msgpack.decode(body, type=SessionRecord)
    except msgspec.DecodeError as exc:
        raise Unreadable(f"its record does not decode: {exc}") from None


def decode_session(session_id: str, data: bytes) -> SessionRecord:
    """The record of `session_id` saved as `data`; Unreadable if it is none, or another's."""
    record = decode_file(data)
    if record.session_id != session_id:
        raise Unreadable(f"it holds session {record.session_id!r}")
    return record


def expired(record: SessionRecord, now: float) -> bool:
    """Whether `record` was idle past its timeout at `now` (wall-clock, as its `last_used`)."""
    if now - record.last_used > record.idle_timeout_s:
        log.info("session_expired_while_down", session_id=record.session_id)
        return True
    return False


class RestorePage:
    """One page of a restore: the records in id order, as many as fit `limit_bytes` encoded. A
    record larger than a whole page is left out, with a warning."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.records: list[SessionRecord] = []
        self._used = 0

    def add(self, record: SessionRecord, data: bytes) -> bool:
        """Takes `record` (saved as `data`); False when the page is full without it."""
        size = len(data) - len(MAGIC) - DIGEST_BYTES  # the record, as it travels in the reply
        if size > self.limit_bytes:
            log.warning(
                "session_too_large_to_restore", session_id=record.session_id, bytes=size, limit=self.limit_bytes
            )
            return True
        if self._used + size > self.limit_bytes:
            return False
        self.records.append(record)
        self._used += size
        return True


class SessionStore:
    """The saved sessions in `root`, one file each, named `<session_id>.session`."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.clock = clock  # the wall clock: records' `last_used` is wall-clock time
        root.mkdir(parents=True, exist_ok=True)
        partial = list(root.glob(f"*{PARTIAL_SUFFIX}"))
        for path in partial:
            path.unlink()
        log.info("session_store_opened", root=str(root), sessions=len(self._ids()), partial_removed=len(partial))

    def save(self, record: SessionRecord) -> bool:
        """Writes `record` over the session's file. If the disk refuses it: a warning, the older
        record deleted too (a restart must not bring back a session without its latest turns,
        whose next turn would continue an earlier one), and False."""
        path = self._path(record.session_id)
        partial = path.with_name(path.name + PARTIAL_SUFFIX)
        try:
            descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "wb") as f:
                f.write(encode_file(record))
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
            self._sync_folder()
        except OSError as exc:  # the disk is full, say: the session lives on in the scheduler alone
            log.warning("session_not_saved", session_id=record.session_id, error=str(exc))
            partial.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            return False
        return True

    def drop(self, session_id: str) -> bool:
        """Deletes the session's file; False if there was none."""
        try:
            self._path(session_id).unlink()
        except FileNotFoundError:
            return False
        self._sync_folder()  # else a crash could bring a closed session back
        return True

    def keep_only(self, session_ids: Collection[str]) -> list[str]:
        """Deletes every saved session not in `session_ids`; returns the ids deleted."""
        kept, dropped = set(session_ids), []
        for session_id in self._ids():
            if session_id not in kept and self.drop(session_id):
                dropped.append(session_id)
        return dropped

    def restore(self, after: str, limit_bytes: int) -> tuple[list[SessionRecord], bool]:
        """The saved sessions with ids after `after`, in id order, as many as fit `limit_bytes`
        encoded, and whether none is left after them. Expired sessions are deleted and unreadable
        files set aside on the way, so neither is returned."""
        page = RestorePage(limit_bytes)
        for session_id in (i for i in self._ids() if i > after):
            path = self._path(session_id)
            try:
                data = path.read_bytes()
                record = decode_session(session_id, data)
            except FileNotFoundError:
                continue
            except Unreadable as exc:
                self._set_aside(path, str(exc))
                continue
            if expired(record, self.clock()):
                self.drop(session_id)
                continue
            if not page.add(record, data):
                return page.records, False
        return page.records, True

    def _ids(self) -> list[str]:
        return sorted(path.name.removesuffix(SUFFIX) for path in self.root.glob(f"*{SUFFIX}"))

    def _path(self, session_id: str) -> Path:
        return self.root / f"{session_id}{SUFFIX}"

    def _set_aside(self, path: Path, reason: str) -> None:
        aside = self.root / UNREADABLE_DIR
        aside.mkdir(exist_ok=True)
        target = aside / f"{path.name}.{time.time_ns()}"
        os.replace(path, target)
        self._sync_folder()
        log.error("session_file_unreadable", path=str(path), moved_to=str(target), reason=reason)

    def _sync_folder(self) -> None:
        descriptor = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
