"""What the sessions table hands the snapshot actor, and what a restarted scheduler makes of it:
every change named once, each turn's new tokens only, and a restored table that continues every
session exactly where the old one stood, without pins."""

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.scheduler.block_pool import BlockPool
from actors.scheduler.radix_cache import RadixCache
from actors.scheduler.session_records import restored_session, session_record
from actors.scheduler.sessions import SessionTable
from schemas.session import BeginTurn, CloseSession, RecordTurn, TurnTokens
from schemas.snapshot import SessionRecord, TurnRecord
from tests.actors.test_sessions import ALICE, ANONYMOUS, BS, evict_all, make, opened, turn


def saved(disk: dict[str, SessionRecord], table: SessionTable) -> None:
    """What the snapshot actor does with the changes: each record as it would cross the bus."""
    changed, dropped = table.take_changes()
    for session in changed:
        data = msgspec.msgpack.encode(session_record(session))
        disk[session.session_id] = msgspec.msgpack.decode(data, type=SessionRecord)
    for session_id in dropped:
        del disk[session_id]


def restarted(disk: dict[str, SessionRecord], clock) -> tuple[BlockPool, RadixCache, SessionTable]:
    """A new scheduler: an empty cache, the saved sessions restored."""
    pool = BlockPool(256)
    cache = RadixCache(pool, BS)
    table = SessionTable(cache, 1024, clock)
    table.restore([restored_session(record) for record in disk.values()])
    return pool, cache, table


def test_each_change_is_named_once_and_a_close_drops():
    pool, cache, table, _ = make()
    first, second = opened(table, ALICE), opened(table)
    turn(table, pool, cache, first, "t1", [1, 2, 3, 4, 5], tenant=ALICE)
    changed, dropped = table.take_changes()
    assert {s.session_id for s in changed} == {first, second} and dropped == []
    assert table.take_changes() == ([], [])
    table.begin_turn(BeginTurn(second, ANONYMOUS, "t2"))  # a turn that runs changes nothing saved
    assert table.take_changes() == ([], [])
    turn(table, pool, cache, first, "t3", [6, 7], tenant=ALICE)
    table.close(CloseSession(second), ANONYMOUS)
    assert table.take_changes() == ([table.sessions[first]], [second])


def test_a_record_keeps_what_each_turn_adds():
    pool, cache, table, _ = make()
    sid = opened(table, ALICE, capacity_tokens=64, idle_timeout_s=30)
    t1 = turn(table, pool, cache, sid, "t1", list(range(100, 120)), tenant=ALICE)
    turn(table, pool, cache, sid, "t2", [7, 8, 9], tenant=ALICE)
    turn(table, pool, cache, sid, "t3", [5], parent="t1", tenant=ALICE)
    record = session_record(table.sessions[sid])
    assert (record.tenant, record.capacity_tokens, record.idle_timeout_s) == (ALICE, 64, 30)
    assert record.last_used == table.sessions[sid].last_used
    assert record.turns == [
        TurnRecord("t1", None, 0, t1),
        TurnRecord("t2", "t1", len(t1), [7, 8, 9]),
        TurnRecord("t3", "t1", len(t1), [5]),
    ]


def test_a_turn_that_does_not_continue_its_parent_is_kept_whole():
    pool, cache, table, _ = make()
    sid = opened(table)
    turn(table, pool, cache, sid, "t1", [1, 2, 3, 4])
    table.begin_turn(BeginTurn(sid, ANONYMOUS, "t2"))
    # Nothing makes an origin's record start with its parent's tokens.
    table.record_turn(RecordTurn(sid, ANONYMOUS, "t2", "t1", False, [1, 2, 9, 9, 9]))
    record = session_record(table.sessions[sid])
    assert record.turns[1] == TurnRecord("t2", "t1", 2, [9, 9, 9])
    assert restored_session(record).turns["t2"].token_ids == [1, 2, 9, 9, 9]


def test_a_record_whose_turns_do_not_hold_together_is_refused():
    record = SessionRecord("s", ANONYMOUS, 64, 30.0, 0.0, [TurnRecord("t2", "t1", 0, [1])])
    with pytest.raises(ValueError, match="'t2' names parent 't1'"):
        restored_session(record)
    record = SessionRecord(
        "s", ANONYMOUS, 64, 30.0, 0.0, [TurnRecord("t1", None, 0, [1]), TurnRecord("t2", "t1", 5, [])]
    )
    with pytest.raises(ValueError, match="shares 5 tokens of its parent's 1"):
        restored_session(record)


def test_a_restored_session_runs_out_its_idle_timeout_by_the_wall_clock():
    pool, cache, table, clock = make()
    sid = opened(table, idle_timeout_s=10)
    turn(table, pool, cache, sid, "t1", [1, 2, 3, 4, 5])
    disk: dict[str, SessionRecord] = {}
    saved(disk, table)
    clock.now += 6  # the server was down this long
    _, _, again = restarted(disk, clock)
    assert again.expire(lambda turn_id: False) == []
    clock.now += 5
    assert again.expire(lambda turn_id: False) == [sid]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_a_restored_table_continues_every_session_where_it_stood(seed):
    rng = random.Random(seed)
    pool, cache, table, clock = make(num_blocks=256, budget_tokens=40)
    disk: dict[str, SessionRecord] = {}
    counter = iter(range(10**6))
    for _ in range(30):
        sessions = list(table.sessions)
        op = rng.choice(["open", "turn", "turn", "turn", "close", "expire"])
        if op == "open" or not sessions:
            opened(table, capacity_tokens=rng.choice([None, 8, 30]), idle_timeout_s=rng.choice([5, 50]))
        elif op == "turn":
            sid = rng.choice(sessions)
            parent = rng.choice([None, *table.sessions[sid].turns])
            if pool.num_free < 100:
                evict_all(cache)
            new_tokens = [rng.randrange(1000) for _ in range(rng.randrange(1, 8))]
            turn(table, pool, cache, sid, f"t{next(counter)}", new_tokens, parent, replace=rng.random() < 0.3)
        elif op == "close":
            table.close(CloseSession(rng.choice(sessions)), ANONYMOUS)
        else:
            clock.now += rng.choice([1, 10])
            table.expire(lambda turn_id: False)
        saved(disk, table)

    _, _, again = restarted(disk, clock)
    assert again.sessions.keys() == table.sessions.keys()
    assert again.pinned_tokens == 0
    for sid, session in table.sessions.items():
        restored = again.sessions[sid]
        fields = ("tenant", "capacity_tokens", "idle_timeout_s", "last_used")
        assert [getattr(restored, f) for f in fields] == [getattr(session, f) for f in fields]
        assert restored.turns == session.turns
        for parent in [None, *session.turns]:
            begin = BeginTurn(sid, ANONYMOUS, f"next-{sid}-{parent}", parent)
            expected = table.begin_turn(begin)
            assert isinstance(expected, TurnTokens) and again.begin_turn(begin) == expected
