"""Who is alive, from heartbeats: each actor instance reports every interval, and one that misses
a few in a row is taken for dead (crashed, or stuck and no longer running its event loop). One
whose loop runs but whose work hangs says so in its beats (`Heartbeat.stuck`)."""

import time
from dataclasses import dataclass

from schemas.health import Heartbeat

MISSED_BEATS = 3


@dataclass
class Instance:
    actor: str
    instance_id: str
    pid: int
    ready: bool
    interval_s: float  # between its heartbeats
    deadline: float  # monotonic time after which it counts as dead
    stuck: str | None = None  # why it makes no progress, as its last beat said


class Liveness:
    def __init__(self, missed_beats: int = MISSED_BEATS) -> None:
        self.missed_beats = missed_beats
        self.instances: dict[str, Instance] = {}

    def observe(self, beat: Heartbeat, now: float | None = None) -> bool:
        """Records a heartbeat; True when it is the first from this instance."""
        now = time.monotonic() if now is None else now
        deadline = now + self.missed_beats * beat.interval_s
        known = self.instances.get(beat.instance_id)
        self.instances[beat.instance_id] = Instance(
            beat.actor, beat.instance_id, beat.pid, beat.ready, beat.interval_s, deadline, beat.stuck
        )
        return known is None

    def expire(self, now: float | None = None) -> list[Instance]:
        """Forgets and returns the instances whose heartbeats stopped."""
        now = time.monotonic() if now is None else now
        dead = [i for i in self.instances.values() if i.deadline < now]
        for instance in dead:
            del self.instances[instance.instance_id]
        return dead

    def stuck(self) -> list[Instance]:
        """Forgets and returns the instances whose last beat said they are stuck."""
        stuck = [i for i in self.instances.values() if i.stuck is not None]
        for instance in stuck:
            del self.instances[instance.instance_id]
        return stuck

    def replace(self, actor: str, instance_id: str) -> list[Instance]:
        """Forgets and returns the instances of `actor` other than `instance_id`: of an actor that
        runs once, a new instance means the old ones are gone, whatever their heartbeats say."""
        replaced = [i for i in self.instances.values() if i.actor == actor and i.instance_id != instance_id]
        for instance in replaced:
            del self.instances[instance.instance_id]
        return replaced

    def forgive_silence(self, now: float | None = None) -> None:
        """Restarts every deadline from now: after our own bus outage, beats we missed say nothing
        about the others."""
        now = time.monotonic() if now is None else now
        for instance in self.instances.values():
            instance.deadline = max(instance.deadline, now + self.missed_beats * instance.interval_s)

    def ready(self, actor: str) -> bool:
        return any(i.actor == actor and i.ready for i in self.instances.values())

    def not_ready(self, actors: tuple[str, ...]) -> dict[str, str]:
        """Of `actors`, those with no live instance that can serve now, each with why: what a stuck
        instance said, else that one is starting, else that none is alive."""
        reasons = {}
        for actor in actors:
            instances = [i for i in self.instances.values() if i.actor == actor]
            if any(i.ready for i in instances):
                continue
            stuck = next((i.stuck for i in instances if i.stuck is not None), None)
            reasons[actor] = stuck or ("alive, not ready" if instances else "no live instance")
        return reasons
