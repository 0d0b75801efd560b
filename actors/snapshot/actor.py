"""The snapshot actor: the one writer of the saved sessions, so that the scheduler's sessions table
outlives the scheduler and the whole server (schemas/snapshot.py has the conversation).

Thin: it decodes, hands each message to a `SessionStore` (session_store.py) on a worker thread, and
replies. One subscription takes every message, and each is handled to its end before the next, so
the disk sees the scheduler's changes in the order it sent them, and a `RestoreSessions` follows
the writes sent before it.

Local files only: servers on several machines sharing sessions through an external NATS's
JetStream key-value and object stores are not built yet.
"""

import asyncio
from pathlib import Path

from actors.snapshot.session_store import SessionStore
from kernel.actor import Actor
from schemas.errors import Error
from schemas.snapshot import (
    DropSession,
    RestoreSessions,
    SaveSession,
    SessionsHeld,
    SessionsRestored,
    SnapshotRequest,
)

SESSIONS_DIR = "sessions"
PAGE_HEADROOM_BYTES = 4096  # of a bus message, beside a page's records: the rest of SessionsRestored


class SnapshotActor(Actor):
    """Keeps the scheduler's sessions on disk and hands them back to a scheduler that starts."""

    name = "snapshot"

    async def start(self) -> None:
        root = Path(self.config.supervision.data_dir) / SESSIONS_DIR
        self.store = await asyncio.to_thread(SessionStore, root)
        await self.bus.subscribe(self.subjects.snapshot_sessions, SnapshotRequest, self._on_request)

    async def _on_request(self, message: SnapshotRequest, _reply_to: str | None) -> SessionsRestored | Error | None:
        match message:
            case SaveSession(record):
                await asyncio.to_thread(self.store.save, record)
            case DropSession(session_id):
                await asyncio.to_thread(self.store.drop, session_id)
            case SessionsHeld(session_ids):
                dropped = await asyncio.to_thread(self.store.keep_only, session_ids)
                if dropped:
                    self.log.info("sessions_dropped_while_away", session_ids=dropped)
            case RestoreSessions(after):
                limit = self.bus.max_payload_bytes - PAGE_HEADROOM_BYTES
                try:
                    records, complete = await asyncio.to_thread(self.store.restore, after, limit)
                except OSError as exc:
                    return Error("unavailable", f"cannot read the saved sessions: {exc}", retriable=True)
                self.log.info("sessions_read", after=after, sessions=len(records), complete=complete)
                return SessionsRestored(records, complete, self.instance_id)
