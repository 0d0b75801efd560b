"""Heartbeats: every actor says it is alive, whether it can serve, and why not when it is stuck."""

import msgspec


class Heartbeat(msgspec.Struct, frozen=True):
    actor: str
    instance_id: str
    pid: int
    ready: bool
    interval_s: float
    # Why the actor makes no progress though its loop runs (a step that hangs), or None: it is then
    # not ready, and the supervisor restarts it. An actor whose loop hangs sends no beats at all.
    stuck: str | None = None
