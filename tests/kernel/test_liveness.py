"""Liveness from heartbeats: silence, a stuck actor's own report, and readiness with its reasons."""

from kernel.liveness import Liveness
from schemas.health import Heartbeat


def beat(actor: str, instance_id: str, ready: bool = True, stuck: str | None = None) -> Heartbeat:
    return Heartbeat(actor, instance_id, pid=1, ready=ready, interval_s=1.0, stuck=stuck)


def test_readiness_says_why_each_actor_cannot_serve():
    liveness = Liveness()
    liveness.observe(beat("tokenizer", "t"), now=0.0)
    liveness.observe(beat("scheduler", "s", ready=False), now=0.0)
    liveness.observe(beat("executor", "e", ready=False, stuck="a step of 2 sequences has run 31.0 s"), now=0.0)
    assert liveness.not_ready(("tokenizer", "scheduler", "executor", "gateway")) == {
        "scheduler": "alive, not ready",
        "executor": "a step of 2 sequences has run 31.0 s",
        "gateway": "no live instance",
    }


def test_a_stuck_instance_is_handed_over_once():
    liveness = Liveness()
    liveness.observe(beat("executor", "e"), now=0.0)
    assert liveness.stuck() == []
    liveness.observe(beat("executor", "e", ready=False, stuck="hung"), now=1.0)
    [stuck] = liveness.stuck()
    assert (stuck.actor, stuck.instance_id, stuck.stuck) == ("executor", "e", "hung")
    assert liveness.stuck() == []  # the supervisor kills it once
    assert liveness.expire(now=100.0) == []  # and it is not taken for dead again later


def test_a_stuck_instance_that_moves_again_is_ready():
    liveness = Liveness()
    liveness.observe(beat("executor", "e", ready=False, stuck="hung"), now=0.0)
    liveness.observe(beat("executor", "e"), now=1.0)
    assert liveness.not_ready(("executor",)) == {}
    assert liveness.stuck() == []


def test_an_older_beat_without_the_field_is_not_stuck():
    import msgspec

    class OldHeartbeat(msgspec.Struct, frozen=True):
        actor: str
        instance_id: str
        pid: int
        ready: bool
        interval_s: float

    wire = msgspec.msgpack.encode(OldHeartbeat("tokenizer", "t", 1, True, 1.0))
    assert msgspec.msgpack.decode(wire, type=Heartbeat).stuck is None
