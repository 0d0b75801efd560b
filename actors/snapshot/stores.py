"""Where the snapshot actor keeps sessions, picked once at its start (`--session-store`): files
under `<data-dir>/sessions/` (session_store.py), or a JetStream key-value bucket of the NATS server
(kv_session_store.py), which servers of one namespace on an external NATS share. Both behind one
async face, `SessionStorage`; the files' blocking I/O runs on a worker thread."""

import asyncio
from collections.abc import Collection
from pathlib import Path
from typing import Protocol

import structlog

from actors.snapshot.kv_session_store import KeyValueSessionStore
from actors.snapshot.session_store import SessionStore
from kernel.bus import Bus
from kernel.bus_kv import JetStreamUnavailable, KeyValueError
from kernel.config import KernelConfig
from kernel.subjects import Subjects
from schemas.snapshot import SessionRecord

SESSIONS_DIR = "sessions"

log = structlog.get_logger()


class SessionStorage(Protocol):
    """The saved sessions. `restore` raises OSError or `KeyValueError` where the storage cannot be
    read; the scheduler asks again."""

    async def save(self, record: SessionRecord) -> bool: ...
    async def drop(self, session_id: str) -> bool: ...
    async def keep_only(self, session_ids: Collection[str]) -> list[str]: ...
    async def restore(self, after: str, limit_bytes: int) -> tuple[list[SessionRecord], bool]: ...


class FileSessionStorage:
    """The files' `SessionStore`, each call on a worker thread, off the actor's event loop."""

    def __init__(self, files: SessionStore) -> None:
        self.files = files

    async def save(self, record: SessionRecord) -> bool:
        return await asyncio.to_thread(self.files.save, record)

    async def drop(self, session_id: str) -> bool:
        return await asyncio.to_thread(self.files.drop, session_id)

    async def keep_only(self, session_ids: Collection[str]) -> list[str]:
        return await asyncio.to_thread(self.files.keep_only, session_ids)

    async def restore(self, after: str, limit_bytes: int) -> tuple[list[SessionRecord], bool]:
        return await asyncio.to_thread(self.files.restore, after, limit_bytes)


async def open_storage(config: KernelConfig, bus: Bus) -> SessionStorage:
    """The storage `--session-store` names: with `auto` (which the supervisor makes `files` under
    its embedded NATS) or `jetstream`, the bus namespace's bucket, or the files, with a warning,
    where the server has no JetStream (under `auto`: where the bucket cannot be opened at all)."""
    if config.supervision.session_store != "files":
        name = Subjects(config.bus.namespace).sessions_bucket
        try:
            bucket = await bus.key_value(name)
        except KeyValueError as exc:
            # Asked for by name, a bucket the server refuses (its permissions, say) is an error to
            # see at once; under `auto`, as where the server has no JetStream, the files serve.
            if config.supervision.session_store == "jetstream" and not isinstance(exc, JetStreamUnavailable):
                raise
            log.warning("sessions_in_files_not_jetstream", reason=str(exc))
        else:
            log.info("session_store_opened", bucket=name)
            return KeyValueSessionStore(bucket)
    root = Path(config.supervision.data_dir) / SESSIONS_DIR
    return FileSessionStorage(await asyncio.to_thread(SessionStore, root))
