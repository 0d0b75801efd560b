"""Sessions for multi-turn work: the scheduler's table of open sessions, their turns, and the KV
they keep pinned in the radix cache.

A turn's tokens are its whole prompt and the output its client got; the next turn's prompt starts
with them, so its prefill matches them in the cache and computes only what is new. While a session
is open, the cached blocks of its leaf turns stay locked (pinned), within the session's capacity
and a budget all sessions share; past those the oldest pins are let go, and their blocks are
evicted like any cached prefix when blocks run short (a later turn recomputes what is gone).

The table is the one owner of the sessions; the snapshot actor keeps a copy on disk. Every change
to what must outlive the scheduler (a session opened, a turn recorded, a session closed or
expired) is collected for the actor to send on (`take_changes`), and a scheduler that starts
`restore`s what was saved: the conversations, without pins. Times are wall-clock seconds, so idle
timeouts run on across restarts.
"""

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from actors.scheduler.radix_cache import RadixCache
from actors.scheduler.radix_node import Node
from schemas.errors import Error
from schemas.requests import Tenant
from schemas.session import (
    BeginTurn,
    CloseSession,
    OpenSession,
    RecordTurn,
    SessionClosed,
    SessionOpened,
    TurnRecorded,
    TurnTokens,
)

DEFAULT_IDLE_TIMEOUT_S = 600.0


@dataclass
class Turn:
    turn_id: str  # the request id that ran it
    parent: str | None
    token_ids: list[int]  # the conversation up to the end of this turn: its prompt and output


@dataclass
class Pin:
    """A lock on the cached blocks of one leaf turn's tokens (a prefix, where capacity cuts it)."""

    turn_id: str
    node: Node  # where the match of the tokens ended; locking it locks its ancestors too
    blocks: frozenset[int]  # every block from the root to `node`


@dataclass
class Session:
    session_id: str
    tenant: Tenant  # who opened it: the tenant its turns run as, whose cached prefixes they read
    capacity_tokens: int
    idle_timeout_s: float
    last_used: float  # wall-clock seconds since the epoch
    turns: dict[str, Turn] = field(default_factory=dict)  # in the order recorded: the last is the latest
    pins: list[Pin] = field(default_factory=list)  # oldest first; one per leaf turn at most
    running: set[str] = field(default_factory=set)  # turns begun and not recorded yet
    pinned_tokens: int = 0  # the blocks of all its pins, counted once each, in tokens


class SessionTable:
    """Open sessions by id. Invariants: the cache holds exactly one lock for every pin, each
    session's pins cover at most its capacity, and all sessions' pins together at most
    `budget_tokens` (a block pinned by two sessions counts for both). A session is known only to
    the tenant that opened it: to anyone else it does not exist."""

    def __init__(self, cache: RadixCache, budget_tokens: int, clock: Callable[[], float] = time.time) -> None:
        self.cache = cache
        self.budget_tokens = budget_tokens
        self.clock = clock  # the wall clock, which a restart keeps (a step of it moves the idle deadlines)
        self.sessions: dict[str, Session] = {}
        self._by_turn: dict[str, Session] = {}  # every turn, recorded or running, of an open session
        self._changed: set[str] = set()  # sessions opened, changed or closed since `take_changes`

    def attach(self, cache: RadixCache, budget_tokens: int) -> None:
        """A new executor came with a new, empty cache: the old pins went with the old one."""
        for session in self.sessions.values():
            session.pins, session.pinned_tokens = [], 0
        self.cache, self.budget_tokens = cache, budget_tokens

    @property
    def pinned_tokens(self) -> int:
        return sum(s.pinned_tokens for s in self.sessions.values())

    # -- what outlives the scheduler --------------------------------------------------------

    def take_changes(self) -> tuple[list[Session], list[str]]:
        """The sessions opened or changed since the last call, and the ids of those closed since."""
        changed, self._changed = self._changed, set()
        saved = [self.sessions[i] for i in sorted(changed) if i in self.sessions]
        return saved, sorted(i for i in changed if i not in self.sessions)

    def restore(self, sessions: list[Session]) -> None:
        """Takes back sessions a scheduler before this one saved. They have no pins: the cache
        they were pinned in went with that scheduler's executor, or was emptied by a restart."""
        for session in sessions:
            if session.session_id not in self.sessions:
                self.sessions[session.session_id] = session
                self._by_turn |= dict.fromkeys(session.turns, session)

    # -- the conversation ------------------------------------------------------------------

    def open(self, message: OpenSession, tenant: Tenant) -> SessionOpened:
        capacity = (
            self.budget_tokens if message.capacity_tokens is None else min(message.capacity_tokens, self.budget_tokens)
        )
        idle_timeout_s = message.idle_timeout_s or DEFAULT_IDLE_TIMEOUT_S
        session = Session(uuid.uuid4().hex, tenant, capacity, idle_timeout_s, self.clock())
        self.sessions[session.session_id] = session
        self._changed.add(session.session_id)
        return SessionOpened(session.session_id, capacity, idle_timeout_s)

    def close(self, message: CloseSession, tenant: Tenant) -> SessionClosed | Error:
        session = self._find(message.session_id, tenant)
        if isinstance(session, Error):
            return session
        self._close(session)
        return SessionClosed(session.session_id)

    def begin_turn(self, message: BeginTurn) -> TurnTokens | Error:
        session = self._find(message.session_id, message.tenant)
        if isinstance(session, Error):
            return session
        if message.turn_id in self._by_turn:
            return Error(
                "invalid_request",
                f"request id {message.turn_id!r} already names a turn of an open session",
                param="request_id",
            )
        parent_id = message.parent_turn if message.parent_turn is not None else next(reversed(session.turns), None)
        parent = session.turns.get(parent_id) if parent_id is not None else None
        if parent_id is not None and parent is None:
            return Error("not_found", f"session {session.session_id} has no turn {parent_id!r}", param="session_parent")
        session.running.add(message.turn_id)
        self._by_turn[message.turn_id] = session
        session.last_used = self.clock()
        return TurnTokens(session.session_id, parent_id, list(parent.token_ids) if parent else [])

    def record_turn(self, message: RecordTurn) -> TurnRecorded | Error:
        session = self._find(message.session_id, message.tenant)
        if isinstance(session, Error):
            return session
        turn_id = message.turn_id
        session.running.discard(turn_id)
        session.last_used = self.clock()
        if turn_id in session.turns:
            return TurnRecorded(session.session_id, turn_id)  # a repeat of a record whose reply was lost
        # The parent may have been dropped meanwhile, by a turn that replaced it: this one stands alone.
        parent = message.parent_turn if message.parent_turn in session.turns else None
        if message.replace and (parent is not None or message.parent_turn is None):
            self._drop_after(session, parent)
        session.turns[turn_id] = turn = Turn(turn_id, parent, list(message.token_ids))
        self._by_turn[turn_id] = session
        self._changed.add(session.session_id)
        self._pin(session, turn)
        if parent is not None:
            self._unpin(session, parent)  # the new turn's tokens start with the parent's: its pin covers them
        self._fit(session)
        return TurnRecorded(session.session_id, turn_id)

    # -- upkeep ----------------------------------------------------------------------------

    def turn_released(self, turn_id: str) -> None:
        """A request left the batch (finished or aborted) and its blocks went to the cache. When it
        is a turn recorded before the scheduler saw it end, its pin takes those blocks now."""
        session = self._by_turn.get(turn_id)
        if session is None:
            return
        session.last_used = self.clock()
        turn = session.turns.get(turn_id)
        if turn is not None and not any(t.parent == turn_id for t in session.turns.values()):
            self._unpin(session, turn_id)
            self._pin(session, turn)
            self._fit(session)

    def expire(self, in_flight: Callable[[str], bool]) -> list[str]:
        """Closes the sessions unused for longer than their idle timeout; a session whose turn is
        still running is in use. Returns the ids closed."""
        now, closed = self.clock(), []
        for session in list(self.sessions.values()):
            for turn_id in [t for t in session.running if not in_flight(t)]:
                session.running.discard(turn_id)  # ended without a record: aborted, or failed
                if turn_id not in session.turns:
                    del self._by_turn[turn_id]
            if session.running:
                session.last_used = now
            elif now - session.last_used > session.idle_timeout_s:
                self._close(session)
                closed.append(session.session_id)
        return closed

    def unpin_oldest(self) -> bool:
        """Lets go of the oldest pin of the least recently used session that has one (a request
        needs its blocks); False if nothing is pinned."""
        pinned = [s for s in self.sessions.values() if s.pins]
        if not pinned:
            return False
        session = min(pinned, key=lambda s: s.last_used)
        self._unpin(session, session.pins[0].turn_id)
        return True

    def unpin_all(self) -> None:
        """Every pinned block becomes evictable (before a cache flush); the sessions stay open."""
        for session in self.sessions.values():
            for pin in list(session.pins):
                self._unpin(session, pin.turn_id)

    # -- pins ------------------------------------------------------------------------------

    def _pin(self, session: Session, turn: Turn) -> None:
        """Locks the cached blocks of `turn`'s tokens, as many leading ones as the capacity allows."""
        bs = self.cache.block_size
        limit = min(session.capacity_tokens, self.budget_tokens) // bs * bs
        # As the batcher matches the turn's next request, but unrecorded: no request reads it now.
        # The match leaves the last token out: one more keeps `limit` tokens within its reach.
        match = self.cache.match(turn.token_ids[: limit + 1], tenant=session.tenant)
        if not match.blocks:
            return
        self.cache.lock(match.node)
        session.pins.append(Pin(turn.turn_id, match.node, frozenset(match.blocks)))
        self._count(session)

    def _unpin(self, session: Session, turn_id: str) -> None:
        for pin in session.pins:
            if pin.turn_id == turn_id:
                session.pins.remove(pin)
                self.cache.unlock(pin.node)
                self._count(session)
                return

    def _count(self, session: Session) -> None:
        blocks = set().union(*(pin.blocks for pin in session.pins))
        session.pinned_tokens = len(blocks) * self.cache.block_size

    def _fit(self, session: Session) -> None:
        """Unpins, oldest first, until `session` is within its capacity and all sessions within the
        budget; the pin `session` made last stays (it was cut to fit both)."""
        while session.pinned_tokens > session.capacity_tokens and len(session.pins) > 1:
            self._unpin(session, session.pins[0].turn_id)
        total = self.pinned_tokens
        if total <= self.budget_tokens:
            return
        for other in sorted(self.sessions.values(), key=lambda s: (s is session, s.last_used)):
            while other.pins and total > self.budget_tokens and not (other is session and len(other.pins) == 1):
                before = other.pinned_tokens
                self._unpin(other, other.pins[0].turn_id)
                total -= before - other.pinned_tokens
            if total <= self.budget_tokens:
                return

    # -- sessions and turns ----------------------------------------------------------------

    def _find(self, session_id: str, tenant: Tenant) -> Session | Error:
        session = self.sessions.get(session_id)
        if session is None or session.tenant != tenant:
            return Error(
                "not_found",
                f"no open session {session_id!r}: it was closed, expired or never opened",
                param="session_id",
            )
        return session

    def _close(self, session: Session) -> None:
        for pin in session.pins:
            self.cache.unlock(pin.node)
        for turn_id in [*session.turns, *session.running]:
            self._by_turn.pop(turn_id, None)
        del self.sessions[session.session_id]
        self._changed.add(session.session_id)

    def _drop_after(self, session: Session, parent: str | None) -> None:
        """Drops the turns that descend from `parent` (every turn, for None), and their pins."""
        dropped = {parent}
        for turn in session.turns.values():  # a turn is recorded after its parent
            if turn.parent in dropped:
                dropped.add(turn.turn_id)
        dropped.discard(parent)
        for turn_id in dropped:
            self._unpin(session, turn_id)
            del session.turns[turn_id]
            del self._by_turn[turn_id]
