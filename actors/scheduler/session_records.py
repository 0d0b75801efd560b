"""A session as the snapshot actor saves it (schemas/snapshot.py) and back: what outlives the
scheduler is the conversation (tenant, capacity, idle timeout, last use, turns), not the pins,
which name blocks of a radix cache that a restart empties.

A turn's tokens start with its parent's, so a record keeps only what each turn adds: a session of
many long turns costs its tokens once, not once per turn.
"""

from actors.scheduler.sessions import Session, Turn
from schemas.snapshot import SessionRecord, TurnRecord


def session_record(session: Session) -> SessionRecord:
    turns = []
    for turn in session.turns.values():
        parent = session.turns[turn.parent].token_ids if turn.parent is not None else []
        shared = _shared_prefix(parent, turn.token_ids)
        turns.append(TurnRecord(turn.turn_id, turn.parent, shared, turn.token_ids[shared:]))
    return SessionRecord(
        session.session_id,
        session.tenant,
        session.capacity_tokens,
        session.idle_timeout_s,
        session.last_used,
        turns,
    )


def restored_session(record: SessionRecord) -> Session:
    """The session of `record`, with no pins and no turn running; ValueError naming the turn if a
    turn's parent is not an earlier turn of it, or its tokens reach past the parent's."""
    session = Session(record.session_id, record.tenant, record.capacity_tokens, record.idle_timeout_s, record.last_used)
    for turn in record.turns:
        parent = session.turns.get(turn.parent) if turn.parent is not None else None
        if turn.parent is not None and parent is None:
            raise ValueError(f"turn {turn.turn_id!r} names parent {turn.parent!r}, which no earlier turn is")
        earlier = parent.token_ids if parent is not None else []
        if turn.shared_tokens > len(earlier):
            raise ValueError(f"turn {turn.turn_id!r} shares {turn.shared_tokens} tokens of its parent's {len(earlier)}")
        session.turns[turn.turn_id] = Turn(turn.turn_id, turn.parent, earlier[: turn.shared_tokens] + turn.token_ids)
    return session


def _shared_prefix(earlier: list[int], tokens: list[int]) -> int:
    """How many leading tokens `tokens` has in common with `earlier`: nearly always all of `earlier`."""
    if tokens[: len(earlier)] == earlier:
        return len(earlier)
    shared = 0
    while shared < min(len(earlier), len(tokens)) and earlier[shared] == tokens[shared]:
        shared += 1
    return shared
