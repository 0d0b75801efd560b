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
from actors.snapshot.session_store import SUFFIX, SessionStore
from kernel.bus import Bus
from kernel.bus_jetstream import NoJetStream
from kernel.config import KernelConfig
from kernel.subjects import Subjects
from schemas.snapshot import SessionRecord

SESSIONS_DIR = "sessions"
MOVE_ALL_BYTES = 1 << 62  # a page with no limit: every saved file at once

log = structlog.get_logger()


class SessionStorage(Protocol):
    """The saved sessions. `restore` raises OSError or `JetStreamError` where the storage cannot be
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
    its embedded NATS) or `jetstream`, the bus namespace's bucket; under `auto`, the files, with a
    warning, where the server has no JetStream at all. Any other failure to open the bucket is
    raised (the supervisor starts the actor again): sessions saved in files meanwhile would be
    missing from the bucket, and the bucket's stale ones would come back."""
    root = Path(config.supervision.data_dir) / SESSIONS_DIR
    if config.supervision.session_store != "files":
        name = Subjects(config.bus.namespace).sessions_bucket
        try:
            bucket = await bus.key_value(name)
        except NoJetStream as exc:
            if config.supervision.session_store == "jetstream":
                raise
            log.warning("sessions_in_files_not_jetstream", reason=str(exc))
        else:
            store = KeyValueSessionStore(bucket)
            await bucket.drop_delete_markers()
            await _move_files_into(store, root)
            log.info("session_store_opened", bucket=name)
            return store
    return FileSessionStorage(await asyncio.to_thread(SessionStore, root))


async def _move_files_into(store: KeyValueSessionStore, root: Path) -> None:
    """Sessions a server saved in files before it ran on this NATS go into an empty bucket, once:
    otherwise they would be lost to it, and come back stale if it ever ran on files again."""
    if not any(root.glob(f"*{SUFFIX}")) or await store.bucket.keys():
        return
    files = await asyncio.to_thread(SessionStore, root)
    records, _ = await asyncio.to_thread(files.restore, "", MOVE_ALL_BYTES)
    for record in records:
        if await store.save(record):
            await asyncio.to_thread(files.drop, record.session_id)
    log.info("sessions_moved_into_bucket", bucket=store.bucket.name, sessions=len(records))
