"""Durable sessions: the scheduler's conversation with the snapshot actor on `<ns>.snapshot.sessions`.

The scheduler owns the sessions table; the snapshot actor keeps a copy of each session on disk so
that the table outlives the scheduler and the whole server. The scheduler publishes every change
(`SaveSession`, `DropSession`) without waiting, and at start asks `RestoreSessions` for what the
disk holds. All of it goes on one subject, so the snapshot actor handles it in the order sent: a
restarted scheduler's `RestoreSessions` is answered after the writes its predecessor sent first.
"""

from typing import Annotated

import msgspec

from schemas.errors import Error
from schemas.requests import Tenant

# A session id names its file: plain characters only (the scheduler's are uuid4 hex).
SessionId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")]


# The records live in files across builds: fields a newer build adds are ignored by an older one
# (never forbidden), and fields at their defaults are left out.
class TurnRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One turn. Its tokens are the conversation up to its end (its prompt and the output its client
    got); they nearly always start with its parent's, so only the rest is kept: the turn's tokens
    are the parent's first `shared_tokens`, then `token_ids`."""

    turn_id: str
    parent: str | None  # a turn recorded earlier in the same session, or None
    shared_tokens: int
    token_ids: list[int]
    # The chained hashes (actors/lib/block_hashes.py) of the whole KV blocks of this turn's tokens
    # that the disk tier holds, so a restored session's next turn loads them instead of recomputing.
    # Left empty until the scheduler writes session chains through to the disk tier.
    block_hashes: list[bytes] = []
    # For hybrid models (Mamba layers beside attention): the key, in the disk tier, of the
    # recurrent state after this turn's tokens, which no KV block can rebuild. None for pure
    # attention models, the only ones served so far.
    recurrent_state_key: bytes | None = None


class SessionRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    session_id: SessionId
    tenant: Tenant  # who opened it: only its requests may use it
    capacity_tokens: int
    idle_timeout_s: float
    last_used: float  # WALL-clock seconds since the epoch: a monotonic clock does not survive a restart
    turns: list[TurnRecord] = []  # in the order recorded, so a parent comes before its children


class SaveSession(msgspec.Struct, frozen=True, tag="save_session"):
    """The session as it stands now, replacing what was saved of it before."""

    record: SessionRecord


class DropSession(msgspec.Struct, frozen=True, tag="drop_session"):
    """The session was closed or expired."""

    session_id: SessionId


class SessionsHeld(msgspec.Struct, frozen=True, tag="sessions_held"):
    """Every session the scheduler holds now: any other saved session is one whose `DropSession`
    was lost (the snapshot actor was down), and is dropped. Sent with a `SaveSession` of each
    held session whenever the snapshot actor or the bus comes back."""

    session_ids: list[SessionId]


class RestoreSessions(msgspec.Struct, frozen=True, tag="restore_sessions"):
    """Every saved session not expired, in pages: the first after no id, each next after the last
    id of the page before, until a page says `complete` (all of them together may not fit one
    bus message)."""

    after: str = ""


class SessionsRestored(msgspec.Struct, frozen=True, tag="sessions_restored"):
    records: list[SessionRecord]  # ordered by session id
    complete: bool  # no session comes after this page's last
    # The snapshot actor's instance that answered: a heartbeat from another one means it restarted
    # and may have lost changes sent meanwhile, so the scheduler sends everything again.
    snapshot_id: str


SnapshotRequest = SaveSession | DropSession | SessionsHeld | RestoreSessions
SnapshotReply = SessionsRestored | Error
