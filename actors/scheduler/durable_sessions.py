"""The scheduler's side of durable sessions: it answers the session conversation over its
`SessionTable`, sends every change to the snapshot actor, which writes it, and at start takes back
what was saved (schemas/snapshot.py).

Changes are published, never awaited: the snapshot actor is the one writer, and a turn does not
wait for a disk. Core NATS delivers at most once, so what was sent while the snapshot actor was
down, or while the bus was, may be lost: when either comes back, every session is sent again, with
the list of those held, so that one closed meanwhile goes from the disk too.
"""

import asyncio

from actors.scheduler.session_records import restored_session, session_record
from actors.scheduler.sessions import Session, SessionTable
from kernel.bus import Bus
from kernel.bus_codec import PayloadTooLarge
from kernel.subjects import Subjects
from schemas.errors import Error
from schemas.health import Heartbeat
from schemas.requests import Tenant
from schemas.session import BeginTurn, CloseSession, OpenSession, RecordTurn, SessionReply
from schemas.snapshot import DropSession, RestoreSessions, SaveSession, SessionRecord, SessionsHeld, SessionsRestored

RESTORE_DEADLINE_S = 30.0  # past it, a scheduler whose snapshot actor never answers serves without the saved sessions
RESTORE_TIMEOUT_S = 10.0  # one page: reading a page of files takes well under this
RESTORE_RETRY_S = 0.2


class DurableSessions:
    """Session requests wait until the saved sessions are restored (`restored`), so a restarted
    scheduler never answers not_found for a session it is still reading back."""

    def __init__(self, bus: Bus, subjects: Subjects, log) -> None:
        self.bus = bus
        self.subject = subjects.snapshot_sessions
        self.log = log
        self.restored = asyncio.Event()  # set when the restore ended, with the sessions or without them
        self._read_whole = False  # whether that restore read every saved session
        self._snapshot_id: str | None = None  # the snapshot actor's instance that has every change

    async def answer(
        self, table: SessionTable, message: OpenSession | CloseSession | BeginTurn | RecordTurn, tenant: Tenant
    ) -> SessionReply:
        await self.restored.wait()
        match message:
            case OpenSession():
                reply = table.open(message, tenant)
                self.log.info("session_opened", session_id=reply.session_id, capacity_tokens=reply.capacity_tokens)
            case CloseSession():
                reply = table.close(message, tenant)
                if not isinstance(reply, Error):
                    self.log.info("session_closed", session_id=message.session_id)
            case BeginTurn():
                reply = table.begin_turn(message)
            case RecordTurn():
                reply = table.record_turn(message)
        await self.send_changes(table)
        return reply

    async def send_changes(self, table: SessionTable) -> None:
        saved, dropped = table.take_changes()
        for session in saved:
            await self._save(session)
        for session_id in dropped:
            await self.bus.publish(self.subject, DropSession(session_id))

    async def restore(self, table: SessionTable) -> None:
        """Asks the snapshot actor for every saved session until it answers or the deadline
        passes, takes them into `table`, and lets the waiting session requests go."""
        records = await self._read_saved()
        if records is None:
            self.log.error(
                "sessions_not_restored", reason=f"the snapshot actor did not answer in {RESTORE_DEADLINE_S} s"
            )
        else:
            sessions = []
            for record in records:
                try:
                    sessions.append(restored_session(record))
                except ValueError as exc:
                    self.log.error("session_not_restored", session_id=record.session_id, reason=str(exc))
            table.restore(sessions)
            self.log.info("sessions_restored", sessions=len(sessions), turns=sum(len(s.turns) for s in sessions))
        self._read_whole = records is not None
        self.restored.set()

    async def snapshot_heard(self, table: SessionTable, beat: Heartbeat) -> None:
        """A snapshot actor other than the one that has every change: it restarted, or came late."""
        if self.restored.is_set() and beat.instance_id != self._snapshot_id:
            self._snapshot_id = beat.instance_id
            self.log.info("sessions_sent_again", snapshot=beat.instance_id, sessions=len(table.sessions))
            await self.send_all(table)

    async def send_all(self, table: SessionTable) -> None:
        """Every held session, and which are held: after changes may have been lost."""
        if not self.restored.is_set():
            return  # the restore reads the disk whole; nothing changed before it ends
        try:
            # Only after a whole read: the saved sessions this scheduler never read are not closed
            # ones, and a SessionsHeld would delete them.
            if self._read_whole:
                await self.bus.publish(self.subject, SessionsHeld(sorted(table.sessions)))
        except PayloadTooLarge as exc:
            # Past some 30,000 sessions under NATS's default 1 MB: a session whose drop was lost
            # then stays on disk, and comes back after a restart until its idle timeout.
            self.log.warning("sessions_held_not_sent", sessions=len(table.sessions), error=str(exc))
        for session in table.sessions.values():
            await self._save(session)

    async def _save(self, session: Session) -> None:
        try:
            await self.bus.publish(self.subject, SaveSession(session_record(session)))
        except PayloadTooLarge as exc:
            # It lives on here but will not outlive this scheduler: an older record of it must not
            # come back after a restart, where its next turn would continue an earlier one.
            self.log.warning("session_not_saved", session_id=session.session_id, error=str(exc))
            await self.bus.publish(self.subject, DropSession(session.session_id))

    async def _read_saved(self) -> list[SessionRecord] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESTORE_DEADLINE_S
        records: list[SessionRecord] = []
        after = ""
        while True:
            reply = await self.bus.request(self.subject, RestoreSessions(after), SessionsRestored, RESTORE_TIMEOUT_S)
            if isinstance(reply, SessionsRestored):
                records += reply.records
                if reply.complete or not reply.records:
                    self._snapshot_id = reply.snapshot_id
                    return records
                after = reply.records[-1].session_id
            elif loop.time() > deadline:
                return None
            else:
                await asyncio.sleep(RESTORE_RETRY_S)
