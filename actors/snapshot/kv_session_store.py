"""The snapshot actor's sessions in a JetStream key-value bucket of the NATS server, for servers on
an external NATS (`--nats-url`): every server of one bus namespace on that NATS reads and writes
the same sessions, so a session saved by a server on one machine continues on another.

The same behaviour as the files (session_store.py): one key per session, named by its id, holding
the same bytes as its file (magic, digest, msgpack record), so a value flipped or cut anywhere is
caught and never served; such a value is deleted and logged, where a file would be set aside (a
bucket has no folder to set it aside in).
"""

import asyncio
import time
from collections.abc import Callable, Collection

import structlog

from actors.snapshot.session_store import RestorePage, Unreadable, decode_session, encode_file, expired
from kernel.bus_jetstream import JetStreamError
from kernel.bus_kv import KeyValueBucket
from schemas.snapshot import SessionRecord

log = structlog.get_logger()
# Values asked for at once in a restore: one round trip for many, where a remote NATS's would add up
# over thousands of sessions.
GETS_AT_ONCE = 64


class KeyValueSessionStore:
    """The saved sessions in `bucket`, one key each. Operations raise `JetStreamError` where the
    bucket does not answer, as the files' raise OSError, except `save`, which reports it."""

    def __init__(self, bucket: KeyValueBucket, clock: Callable[[], float] = time.time) -> None:
        self.bucket = bucket
        self.clock = clock  # the wall clock: records' `last_used` is wall-clock time, across machines
        self._listing: list[str] = []  # the keys, in order, as a restore's first page listed them

    async def save(self, record: SessionRecord) -> bool:
        """Puts `record` over the session's value. If the bucket refuses it: a warning, the older
        value deleted too (a restore must not bring back a session without its latest turns), and
        False."""
        try:
            await self.bucket.put(record.session_id, encode_file(record))
        except JetStreamError as exc:  # too large for the server, or JetStream is down
            log.warning("session_not_saved", session_id=record.session_id, error=str(exc))
            try:
                await self.bucket.delete(record.session_id)
            except JetStreamError:
                pass  # unreachable now: the scheduler sends every session again when the bus is back
            return False
        return True

    async def drop(self, session_id: str) -> bool:
        """Deletes the session's value; False if there was none."""
        if await self.bucket.get(session_id) is None:
            return False
        await self.bucket.delete(session_id)
        return True

    async def keep_only(self, session_ids: Collection[str]) -> list[str]:
        """Deletes every saved session not in `session_ids`; returns the ids deleted."""
        kept, dropped = set(session_ids), []
        for session_id in sorted(await self.bucket.keys()):
            if session_id not in kept and await self.drop(session_id):  # not deleted already
                dropped.append(session_id)
        return dropped

    async def restore(self, after: str, limit_bytes: int) -> tuple[list[SessionRecord], bool]:
        """The saved sessions with ids after `after`, in id order, as many as fit `limit_bytes`
        encoded, and whether none is left after them. Expired sessions and unreadable values are
        deleted on the way, so neither is returned."""
        page = RestorePage(limit_bytes)
        if not after:  # a restore begins: the keys are listed once for all its pages
            self._listing = sorted(await self.bucket.keys())
        ids = [i for i in self._listing if i > after]
        for start in range(0, len(ids), GETS_AT_ONCE):
            chunk = ids[start : start + GETS_AT_ONCE]
            values = await asyncio.gather(*(self.bucket.get(session_id) for session_id in chunk))
            for session_id, data in zip(chunk, values):
                record = await self._readable(session_id, data)
                if record is not None and not page.add(record, data):
                    return page.records, False
        return page.records, True

    async def _readable(self, session_id: str, data: bytes | None) -> SessionRecord | None:
        """The record in `data`, or None where there is none to restore: deleted since the listing
        (by this deployment's scheduler or another's), unreadable, or expired (the last two
        deleted here)."""
        if data is None:
            return None
        try:
            record = decode_session(session_id, data)
        except Unreadable as exc:
            await self.bucket.delete(session_id)
            log.error("session_value_unreadable", bucket=self.bucket.name, session_id=session_id, reason=str(exc))
            return None
        if expired(record, self.clock()):
            await self.bucket.delete(session_id)
            return None
        return record
