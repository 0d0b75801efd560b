"""When the origin moves its running requests, and which ones: the decisions, with no I/O.

A request runs on the one scheduler and, if it wants text, is tracked by one tokenizer. When either
is gone (its heartbeats stopped; for the scheduler, also a new one's first heartbeat), or when the
origin's own bus connection comes back (anything in flight may have been lost), the origin
resubmits the request from its record as prompt + delivered tokens under the same id: a migration.
`Migrations` (migrations.py) carries them out.
"""

import time
from dataclasses import dataclass

import structlog

from actors.lib.origin.request_stream import RequestRecord
from kernel.liveness import Liveness
from schemas.errors import Error
from schemas.health import Heartbeat

log = structlog.get_logger()

# After a bus outage, a request that gets nothing for STALL_S is migrated again, for STALL_WATCH_S:
# a resync that lost a message must not hang a request.
STALL_S = 5.0
STALL_WATCH_S = 60.0


@dataclass(frozen=True)
class Migration:
    """Which running requests move, and how."""

    reason: str  # for the log
    retrack: bool  # track them on a tokenizer again before submitting (theirs is gone, or may be)
    tokenizer_id: str | None = None  # only the requests this tokenizer tracked; None: every one

    def affects(self, record: RequestRecord) -> bool:
        return self.tokenizer_id is None or record.tokenizer_id == self.tokenizer_id


# Moves of one request, which the pipeline starts itself.
STALLED = Migration("stalled after a bus outage", retrack=True)
# The tokenizer had not the Track when the run's first outputs came: it tracks it now, so the
# request is submitted again, and the new run's outputs reach it.
MISSED_START = Migration("its first outputs overtook the track", retrack=False)


class MigrationPolicy:
    """Reads the heartbeats of the actors downstream and the bus's reconnections, and says what
    moves. It holds those heartbeats, so it also says which actors are ready. Invariant: a request
    moves at most `max_migrations` times; the move after that fails it."""

    def __init__(self, max_migrations: int) -> None:
        self.max_migrations = max_migrations
        self._liveness = Liveness()
        self._watch_stalls_until = 0.0  # monotonic time

    def on_heartbeat(self, beat: Heartbeat, now: float | None = None) -> Migration | None:
        first = self._liveness.observe(beat, now)
        # There is one scheduler: a new one means the old one is gone, whatever its heartbeats say.
        if first and beat.actor == "scheduler" and self._liveness.replace(beat.actor, beat.instance_id):
            return Migration("scheduler restarted", retrack=False)
        return None

    def on_bus_reconnected(self, now: float | None = None) -> Migration:
        """Outputs, tracks or submits may have been lost while the bus was down: every running
        request moves, tracked again if it wants text, and for STALL_WATCH_S those that stall
        move again. Heartbeats missed meanwhile say nothing about the others."""
        now = time.monotonic() if now is None else now
        self._liveness.forgive_silence(now)
        self._watch_stalls_until = now + STALL_WATCH_S
        return Migration("bus reconnected", retrack=True)

    def on_silence(self, now: float | None = None) -> list[Migration]:
        """The moves called for by actors whose heartbeats have stopped since the last call."""
        migrations = []
        for dead in self._liveness.expire(now):
            log.warning("actor_lost", actor=dead.actor, instance=dead.instance_id)
            if dead.actor == "scheduler":
                migrations.append(Migration("scheduler lost", retrack=False))
            elif dead.actor == "tokenizer":
                migrations.append(Migration("tokenizer lost", retrack=True, tokenizer_id=dead.instance_id))
        return migrations

    def watching_stalls(self, now: float) -> bool:
        return now < self._watch_stalls_until

    def count_move(self, record: RequestRecord) -> Error | None:
        """Counts a move of `record`; past `max_migrations`, the error that fails it instead."""
        record.migrations += 1
        if record.migrations > self.max_migrations:
            return Error(
                "unavailable", f"the request was migrated {self.max_migrations} times; retry it", retriable=True
            )
        return None

    def not_ready(self, actors: tuple[str, ...]) -> dict[str, str]:
        """Of `actors`, those with no live instance that can serve now, each with why."""
        return self._liveness.not_ready(actors)

    def live_instances(self, actors: tuple[str, ...]) -> int:
        """How many instances of `actors` are alive, by their heartbeats."""
        return sum(1 for instance in self._liveness.instances.values() if instance.actor in actors)
