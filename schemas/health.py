"""Heartbeats: every actor says it is alive and whether it can serve."""

import msgspec


class Heartbeat(msgspec.Struct, frozen=True):
    actor: str
    instance_id: str
    pid: int
    ready: bool
    interval_s: float
