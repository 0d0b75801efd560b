"""Which requests the origin moves, and when: from the heartbeats of the actors downstream and the
bus's reconnections. No bus here: the policy is handed heartbeats and the time."""

from actors.lib.origin.migration_policy import STALL_WATCH_S, Migration, MigrationPolicy
from actors.lib.origin.request_stream import RequestRecord
from schemas.generate import SamplingParams
from schemas.health import Heartbeat


def beat(actor: str, instance_id: str, ready: bool = True) -> Heartbeat:
    return Heartbeat(actor, instance_id, pid=1, ready=ready, interval_s=1.0)


def record(tokenizer_id: str = "") -> RequestRecord:
    return RequestRecord("r", [1, 2], SamplingParams(), tokenizer_id=tokenizer_id)


def test_a_new_scheduler_moves_every_request_once():
    policy = MigrationPolicy(max_migrations=3)
    assert policy.on_heartbeat(beat("scheduler", "old"), now=0.0) is None  # the first: nothing ran before it
    assert policy.on_heartbeat(beat("scheduler", "old"), now=1.0) is None
    moved = policy.on_heartbeat(beat("scheduler", "new", ready=False), now=1.5)
    assert moved == Migration("scheduler restarted", retrack=False)
    assert moved.affects(record("tokenizer-1")) and moved.affects(record())
    assert policy.on_heartbeat(beat("scheduler", "new", ready=False), now=2.0) is None
    # The old one is gone, whatever its last heartbeat said: it neither counts as ready nor dies later.
    assert list(policy.not_ready(("scheduler",))) == ["scheduler"]
    assert policy.on_silence(now=4.5) == []


def test_a_silent_scheduler_moves_every_request():
    policy = MigrationPolicy(max_migrations=3)
    policy.on_heartbeat(beat("scheduler", "s"), now=0.0)
    assert policy.on_silence(now=2.9) == []  # three beats may be missed
    assert policy.on_silence(now=3.1) == [Migration("scheduler lost", retrack=False)]
    assert policy.on_silence(now=3.2) == []  # once
    assert list(policy.not_ready(("scheduler",))) == ["scheduler"]


def test_a_silent_tokenizer_moves_only_the_requests_it_tracked():
    policy = MigrationPolicy(max_migrations=3)
    policy.on_heartbeat(beat("tokenizer", "t1"), now=0.0)
    policy.on_heartbeat(beat("tokenizer", "t2"), now=2.0)
    [moved] = policy.on_silence(now=3.5)
    assert moved.retrack  # its requests need another tokenizer before they run again
    assert moved.affects(record("t1")) and not moved.affects(record("t2"))
    assert policy.not_ready(("tokenizer",)) == {}  # t2 serves


def test_after_a_bus_outage_everything_moves_and_stalls_are_watched_for_a_while():
    policy = MigrationPolicy(max_migrations=3)
    policy.on_heartbeat(beat("scheduler", "s"), now=0.0)
    assert not policy.watching_stalls(now=0.0)
    moved = policy.on_bus_reconnected(now=10.0)
    assert moved.retrack and moved.affects(record("t1")) and moved.affects(record())
    # Beats missed while our own connection was down say nothing about the scheduler.
    assert policy.on_silence(now=12.0) == []
    assert policy.watching_stalls(now=10.0 + STALL_WATCH_S - 1)
    assert not policy.watching_stalls(now=10.0 + STALL_WATCH_S)


def test_a_request_moves_at_most_max_migrations_times():
    policy = MigrationPolicy(max_migrations=2)
    moving = record()
    assert policy.count_move(moving) is None and policy.count_move(moving) is None
    error = policy.count_move(moving)
    assert (error.code, error.retriable) == ("unavailable", True)
    assert "migrated 2 times" in error.message
