"""The snapshot actor: the one writer of the saved sessions, so that the scheduler's sessions table
outlives the scheduler and the whole server (schemas/snapshot.py has the conversation).

Thin: it decodes, hands each message to its `SessionStorage` (stores.py: local files, or with an
external NATS a JetStream key-value bucket that servers on several machines share), and replies.
One subscription takes every message, and each is handled to its end before the next, so the
storage sees the scheduler's changes in the order it sent them, and a `RestoreSessions` follows
the writes sent before it.
"""

from actors.snapshot.stores import open_storage
from kernel.actor import Actor
from kernel.bus_jetstream import JetStreamError
from schemas.errors import Error
from schemas.snapshot import (
    DropSession,
    RestoreSessions,
    SaveSession,
    SessionsHeld,
    SessionsRestored,
    SnapshotRequest,
)

PAGE_HEADROOM_BYTES = 4096  # of a bus message, beside a page's records: the rest of SessionsRestored


class SnapshotActor(Actor):
    """Keeps the scheduler's sessions on disk or in JetStream and hands them back to a scheduler that starts."""

    name = "snapshot"

    async def start(self) -> None:
        self.store = await open_storage(self.config, self.bus)
        await self.bus.subscribe(self.subjects.snapshot_sessions, SnapshotRequest, self._on_request)

    async def _on_request(self, message: SnapshotRequest, _reply_to: str | None) -> SessionsRestored | Error | None:
        match message:
            case SaveSession(record):
                await self.store.save(record)
            case DropSession(session_id):
                await self.store.drop(session_id)
            case SessionsHeld(session_ids):
                dropped = await self.store.keep_only(session_ids)
                if dropped:
                    self.log.info("sessions_dropped_while_away", session_ids=dropped)
            case RestoreSessions(after):
                limit = self.bus.max_payload_bytes - PAGE_HEADROOM_BYTES
                try:
                    records, complete = await self.store.restore(after, limit)
                except (OSError, JetStreamError) as exc:
                    return Error("unavailable", f"cannot read the saved sessions: {exc}", retriable=True)
                self.log.info("sessions_read", after=after, sessions=len(records), complete=complete)
                return SessionsRestored(records, complete, self.instance_id)
