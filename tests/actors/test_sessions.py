"""The sessions table on its own, over a real radix cache and block pool: turns, branches, idle
expiry, and which KV blocks stay pinned within each session's capacity and the global budget."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.scheduler.block_pool import BlockPool
from actors.scheduler.radix_cache import RadixCache
from actors.scheduler.sessions import DEFAULT_IDLE_TIMEOUT_S, SessionTable
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

BS = 4
ALICE, BOB, ANONYMOUS = Tenant("alice"), Tenant("bob"), Tenant()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(num_blocks: int = 64, budget_tokens: int = 1024) -> tuple[BlockPool, RadixCache, SessionTable, Clock]:
    pool = BlockPool(num_blocks)
    cache = RadixCache(pool, BS)
    clock = Clock()
    return pool, cache, SessionTable(cache, budget_tokens, clock), clock


def compute(pool: BlockPool, cache: RadixCache, tenant: Tenant, tokens: list[int]) -> None:
    """What the batcher leaves in the cache when a request with these prompt and output tokens ends:
    every full block but the one holding the last token, whose KV was never computed."""
    full = (len(tokens) - 1) // BS
    blocks = pool.allocate(full)
    cache.insert(tokens[: full * BS], blocks, tenant=tenant)
    pool.release(blocks)


def turn(
    table: SessionTable,
    pool: BlockPool,
    cache: RadixCache,
    session_id: str,
    turn_id: str,
    new_tokens: list[int],
    parent: str | None = None,
    replace: bool = False,
    tenant: Tenant = ANONYMOUS,
) -> list[int]:
    """One turn as an origin runs it: begin, compute, record. Returns the turn's tokens."""
    begun = table.begin_turn(BeginTurn(session_id, tenant, turn_id, parent))
    assert isinstance(begun, TurnTokens), begun
    tokens = begun.token_ids + new_tokens
    compute(pool, cache, tenant, tokens)
    assert table.record_turn(
        RecordTurn(session_id, tenant, turn_id, begun.parent_turn, replace, tokens)
    ) == TurnRecorded(session_id, turn_id)
    return tokens


def check(table: SessionTable, pool: BlockPool, cache: RadixCache) -> None:
    """The cache holds one reference per stored block and no other; the blocks it keeps locked are
    exactly those pinned by sessions; every session is within its capacity, all within the budget."""
    tree = cache.cached_blocks()
    assert len(tree) == len(set(tree))
    assert all(pool.ref_count(b) == (b in tree) for b in range(pool.num_blocks))
    pinned = set()
    for session in table.sessions.values():
        blocks = set().union(*(pin.blocks for pin in session.pins))
        assert session.pinned_tokens == len(blocks) * BS <= max(session.capacity_tokens, 0)
        assert all(pin.node.lock_ref > 0 for pin in session.pins)
        pinned |= blocks
    stats = cache.stats()
    assert stats.cached_blocks - stats.evictable_blocks == len(pinned)
    assert pinned <= set(tree)
    assert table.pinned_tokens <= table.budget_tokens


def opened(table: SessionTable, tenant: Tenant = ANONYMOUS, **fields) -> str:
    reply = table.open(OpenSession(**fields), tenant)
    assert isinstance(reply, SessionOpened)
    return reply.session_id


def evict_all(cache: RadixCache) -> None:
    cache.evict(cache.stats().evictable_blocks)


def test_open_and_close():
    pool, cache, table, _ = make(budget_tokens=64)
    reply = table.open(OpenSession(capacity_tokens=1000, idle_timeout_s=5), ALICE)
    assert (reply.capacity_tokens, reply.idle_timeout_s) == (64, 5)  # never more than the budget
    assert table.open(OpenSession(), ANONYMOUS).idle_timeout_s == DEFAULT_IDLE_TIMEOUT_S
    sid = reply.session_id
    assert table.begin_turn(BeginTurn(sid, ALICE, "t1")) == TurnTokens(sid, None, [])

    # Another tenant's session does not exist for them, nor for another user of the same tenant.
    for stranger in (BOB, ANONYMOUS, Tenant("alice", "bob")):
        assert table.begin_turn(BeginTurn(sid, stranger, "t2")).code == "not_found"
        assert table.close(CloseSession(sid), stranger).code == "not_found"
    assert table.close(CloseSession(sid), ALICE) == SessionClosed(sid)
    for reply in (
        table.close(CloseSession(sid), ALICE),
        table.begin_turn(BeginTurn(sid, ALICE, "t3")),
        table.record_turn(RecordTurn(sid, ALICE, "t1", None, False, [1, 2])),
    ):
        assert isinstance(reply, Error) and (reply.code, reply.param) == ("not_found", "session_id")
    assert table.close(CloseSession("no-such-session"), ANONYMOUS).code == "not_found"
    check(table, pool, cache)


def test_each_turn_continues_the_latest_or_a_named_one():
    pool, cache, table, _ = make()
    sid = opened(table)
    t1 = turn(table, pool, cache, sid, "t1", [1, 2, 3, 4, 5, 6])
    t2 = turn(table, pool, cache, sid, "t2", [7, 8, 9])
    assert t2 == t1 + [7, 8, 9]
    assert table.begin_turn(BeginTurn(sid, ANONYMOUS, "t3")) == TurnTokens(sid, "t2", t2)
    assert table.begin_turn(BeginTurn(sid, ANONYMOUS, "t4", parent_turn="t1")) == TurnTokens(sid, "t1", t1)
    missing = table.begin_turn(BeginTurn(sid, ANONYMOUS, "t5", parent_turn="nope"))
    assert (missing.code, missing.param) == ("not_found", "session_parent")
    assert table.begin_turn(BeginTurn(sid, ANONYMOUS, "t1")).code == "invalid_request"  # an id names one turn only
    check(table, pool, cache)


def test_a_branch_keeps_the_others_unless_it_replaces_them():
    pool, cache, table, _ = make()
    sid = opened(table)
    t1 = turn(table, pool, cache, sid, "t1", list(range(10, 20)))
    turn(table, pool, cache, sid, "t2", list(range(20, 30)))
    turn(table, pool, cache, sid, "t3", list(range(30, 40)))
    t4 = turn(table, pool, cache, sid, "t4", list(range(40, 50)), parent="t1")
    assert t4 == t1 + list(range(40, 50))
    assert list(table.sessions[sid].turns) == ["t1", "t2", "t3", "t4"]
    assert {pin.turn_id for pin in table.sessions[sid].pins} == {"t3", "t4"}  # the leaves
    check(table, pool, cache)

    turn(table, pool, cache, sid, "t5", list(range(50, 60)), parent="t1", replace=True)
    assert list(table.sessions[sid].turns) == ["t1", "t5"]
    assert table.begin_turn(BeginTurn(sid, ANONYMOUS, "t6", parent_turn="t2")).code == "not_found"
    assert table.begin_turn(BeginTurn(sid, ANONYMOUS, "t7")).parent_turn == "t5"
    assert [pin.turn_id for pin in table.sessions[sid].pins] == ["t5"]
    check(table, pool, cache)


def test_pinned_turns_survive_eviction_until_the_session_closes():
    pool, cache, table, _ = make(num_blocks=32)
    sid = opened(table)
    t1 = turn(table, pool, cache, sid, "t1", list(range(100, 113)))  # 13 tokens: 3 full blocks computed
    compute(pool, cache, ANONYMOUS, list(range(500, 521)))  # another request's prefix, not pinned
    evict_all(cache)
    check(table, pool, cache)
    assert cache.match(t1 + [0]).num_tokens == 12
    assert cache.match(list(range(500, 521))).num_tokens == 0

    t2 = turn(table, pool, cache, sid, "t2", list(range(200, 208)))
    assert [pin.turn_id for pin in table.sessions[sid].pins] == ["t2"]  # t1's pin is covered by t2's
    evict_all(cache)
    assert cache.match(t2 + [0]).num_tokens == (len(t2) - 1) // BS * BS
    check(table, pool, cache)

    table.close(CloseSession(sid), ANONYMOUS)
    check(table, pool, cache)
    evict_all(cache)
    assert pool.num_free == pool.num_blocks


def test_a_session_pins_no_more_than_its_capacity():
    pool, cache, table, _ = make()
    sid = opened(table, capacity_tokens=10)  # 2 blocks
    t1 = turn(table, pool, cache, sid, "t1", list(range(100, 121)))
    assert table.sessions[sid].pinned_tokens == 8
    evict_all(cache)
    assert cache.match(t1).num_tokens == 8  # the leading blocks: what the next turn reads first
    check(table, pool, cache)

    # Two branches that together pass the capacity: the older one's pin goes.
    sid2 = opened(table, capacity_tokens=16)
    turn(table, pool, cache, sid2, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    turn(table, pool, cache, sid2, "b", [10, 11, 12, 13, 14])
    turn(table, pool, cache, sid2, "c", [20, 21, 22, 23, 24], parent="a")
    assert [pin.turn_id for pin in table.sessions[sid2].pins] == ["b", "c"]  # share "a": 16 tokens together
    check(table, pool, cache)
    turn(table, pool, cache, sid2, "d", [30, 31, 32, 33, 34], parent="a")
    assert [pin.turn_id for pin in table.sessions[sid2].pins] == ["c", "d"]
    check(table, pool, cache)


def test_all_sessions_together_pin_no_more_than_the_budget():
    pool, cache, table, clock = make(budget_tokens=20)
    first, second = opened(table), opened(table)
    turn(table, pool, cache, first, "a", list(range(100, 113)))  # 12 tokens pinned
    clock.now += 1
    turn(table, pool, cache, second, "b", list(range(200, 213)))  # 12 more: the least recently used goes
    assert table.sessions[first].pinned_tokens == 0
    assert table.sessions[second].pinned_tokens == 12
    check(table, pool, cache)

    # A turn longer than the budget pins only the budget's worth.
    clock.now += 1
    turn(table, pool, cache, first, "c", list(range(300, 340)))
    assert table.sessions[first].pinned_tokens == 20 and table.sessions[second].pinned_tokens == 0
    check(table, pool, cache)

    assert table.unpin_oldest() and table.pinned_tokens == 0
    assert not table.unpin_oldest()
    check(table, pool, cache)


def test_idle_sessions_close_themselves_but_not_while_a_turn_runs():
    pool, cache, table, clock = make()
    sid, other = opened(table, idle_timeout_s=10), opened(table, idle_timeout_s=100)
    turn(table, pool, cache, sid, "t1", list(range(100, 113)))
    clock.now += 9
    assert table.expire(lambda turn_id: False) == []
    table.begin_turn(BeginTurn(sid, ANONYMOUS, "t2"))
    clock.now += 30
    assert table.expire(lambda turn_id: turn_id == "t2") == []  # t2 is still running
    clock.now += 11
    assert table.expire(lambda turn_id: False) == [sid]  # t2 ended without a record (its client left)
    assert table.begin_turn(BeginTurn(sid, ANONYMOUS, "t3")).code == "not_found"
    assert other in table.sessions
    check(table, pool, cache)
    evict_all(cache)
    assert pool.num_free == pool.num_blocks


def test_a_session_pins_only_what_its_tenant_may_read():
    pool, cache, table, _ = make()
    alice, bob = opened(table, ALICE), opened(table, BOB)
    tokens = list(range(100, 113))
    turn(table, pool, cache, alice, "a1", tokens, tenant=ALICE)
    table.begin_turn(BeginTurn(bob, BOB, "b1"))
    table.record_turn(RecordTurn(bob, BOB, "b1", None, False, tokens))  # the same tokens, computed by alice only
    assert table.sessions[alice].pinned_tokens == 12
    assert table.sessions[bob].pinned_tokens == 0
    check(table, pool, cache)


def test_a_turn_recorded_before_its_blocks_reach_the_cache_is_pinned_when_they_do():
    pool, cache, table, _ = make()
    sid = opened(table)
    tokens = list(range(100, 113))
    table.begin_turn(BeginTurn(sid, ANONYMOUS, "t1"))
    table.record_turn(RecordTurn(sid, ANONYMOUS, "t1", None, False, tokens))
    assert table.sessions[sid].pinned_tokens == 0
    compute(pool, cache, ANONYMOUS, tokens)
    table.turn_released("t1")
    assert table.sessions[sid].pinned_tokens == 12
    check(table, pool, cache)


def test_pinning_a_turn_counts_as_no_cache_hit():
    """A session finds the KV to pin through the cache, but only requests read it: a pin must not
    raise the hit rate that GET /admin/cache reports, nor the hit counts that eviction weighs."""
    pool, cache, table, _ = make()
    sid = opened(table)
    turn(table, pool, cache, sid, "t1", list(range(100, 113)))
    turn(table, pool, cache, sid, "t2", list(range(200, 208)))
    table.turn_released("t2")  # pins again
    assert (cache.stats().hit_tokens, cache.stats().queried_tokens) == (0, 0)
    node = table.sessions[sid].pins[0].node
    while node.parent is not None:
        assert node.hits == 1.0  # what storing gave it
        node = node.parent


def test_a_new_cache_starts_without_pins_and_flushing_unpins():
    pool, cache, table, _ = make()
    sid = opened(table)
    turn(table, pool, cache, sid, "t1", list(range(100, 113)))
    table.unpin_all()
    assert table.pinned_tokens == 0 and "t1" in table.sessions[sid].turns
    check(table, pool, cache)
    turn(table, pool, cache, sid, "t2", [1, 2, 3, 4, 5])

    new_pool = BlockPool(64)
    new_cache = RadixCache(new_pool, BS)
    table.attach(new_cache, 1024)  # a new executor: the old cache and its locks are gone
    assert table.pinned_tokens == 0
    turn(table, new_pool, new_cache, sid, "t3", [6, 7, 8, 9, 10])
    assert table.sessions[sid].pinned_tokens > 0
    check(table, new_pool, new_cache)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(4, 40))
def test_any_sequence_of_operations_keeps_the_invariants(seed, budget_tokens):
    rng = random.Random(seed)
    pool, cache, table, clock = make(num_blocks=256, budget_tokens=budget_tokens)
    counter = iter(range(10**6))
    for _ in range(40):
        op = rng.choice(["open", "turn", "turn", "turn", "close", "expire", "evict", "unpin"])
        sessions = list(table.sessions)
        if op == "open" or not sessions:
            opened(table, capacity_tokens=rng.choice([None, 0, 5, 12, 30]), idle_timeout_s=rng.choice([5, 50]))
        elif op == "turn":
            sid = rng.choice(sessions)
            turns = list(table.sessions[sid].turns)
            parent = rng.choice([None, *turns])
            new_tokens = [rng.randrange(1000) for _ in range(rng.randrange(1, 8))]
            if pool.num_free < 100:  # a turn's tokens fill at most 80 blocks; at most 10 are pinned
                evict_all(cache)
            turn(table, pool, cache, sid, f"t{next(counter)}", new_tokens, parent, replace=rng.random() < 0.3)
        elif op == "close":
            table.close(CloseSession(rng.choice(sessions)), ANONYMOUS)
        elif op == "expire":
            clock.now += rng.choice([1, 10])
            table.expire(lambda turn_id: False)
        elif op == "evict":
            cache.evict(rng.randrange(1, 10))
        else:
            table.unpin_oldest()
        check(table, pool, cache)
    for sid in list(table.sessions):
        table.close(CloseSession(sid), ANONYMOUS)
    evict_all(cache)
    assert pool.num_free == pool.num_blocks
