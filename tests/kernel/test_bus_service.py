"""Every bus is a NATS micro service: `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS` (what `nats micro
ls`, `info` and `stats` send) list its subscriptions as endpoints, with counts, while each
subscription answers exactly as before: a subject several buses listen on still reaches every one,
and bad messages and failing handlers still get typed `Error` replies. Also `Bus.gather`, which asks
every listener of a subject at once."""

import asyncio
import json
import time

import msgspec
import nats

from kernel.bus import Bus
from schemas.errors import Error


class Ask(msgspec.Struct, frozen=True, tag="ask"):
    fail: bool = False


class Told(msgspec.Struct, frozen=True, tag="told"):
    by: str


class Note(msgspec.Struct, frozen=True, tag="note"):
    pass


async def worker(url: str, name: str, notes: list[str]) -> Bus:
    """A bus serving `t.ask` in a queue group and receiving every `t.notes`, as an actor does."""
    bus = await Bus.connect(url, name)

    async def answer(message: Ask, _reply_to) -> Told | Error:
        if message.fail:
            raise RuntimeError("asked to fail")
        return Told(name)

    async def note(_message: Note, _reply_to) -> None:
        notes.append(name)

    await bus.subscribe("t.ask", Ask, answer, queue="workers")
    await bus.subscribe("t.notes", Note, note)
    await bus.serve_as_service("worker", "1.2.3", "Answers asks.", {"instance": name})
    return bus


async def discover(nc, subject: str, expected: int) -> list[dict]:
    """What the `nats` CLI does: one request on a `$SRV` subject, and every reply within a while."""
    inbox = nc.new_inbox()
    subscription = await nc.subscribe(inbox)
    await nc.publish(subject, b"", reply=inbox)
    replies = []
    while len(replies) < expected:
        replies.append(json.loads((await subscription.next_msg(timeout=5)).data))
    await subscription.unsubscribe()
    return replies


async def test_tooling_lists_pings_and_reads_every_bus_while_subscriptions_answer_as_before(nats_url):
    notes: list[str] = []
    buses = [await worker(nats_url, name, notes) for name in ("a", "b")]
    nc = await nats.connect(nats_url)
    try:
        pings = await discover(nc, "$SRV.PING.worker", 2)
        assert {p["metadata"]["instance"] for p in pings} == {"a", "b"}
        assert {(p["name"], p["version"], p["type"]) for p in pings} == {
            ("worker", "1.2.3", "io.nats.micro.v1.ping_response")
        }

        # The fan-out subject still reaches both buses; the queue group still answers once.
        await nc.publish("t.notes", msgspec.msgpack.encode(Note()))
        reply = await nc.request("t.ask", msgspec.msgpack.encode(Ask()), timeout=5)
        assert isinstance(msgspec.msgpack.decode(reply.data, type=Told | Error), Told)
        undecodable = await nc.request("t.ask", b"\xc1", timeout=5)
        assert msgspec.msgpack.decode(undecodable.data, type=Error).code == "invalid_request"
        failed = await nc.request("t.ask", msgspec.msgpack.encode(Ask(fail=True)), timeout=5)
        assert msgspec.msgpack.decode(failed.data, type=Error).code == "internal"
        deadline = time.monotonic() + 5
        while sorted(notes) != ["a", "b"] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sorted(notes) == ["a", "b"]

        infos = await discover(nc, "$SRV.INFO.worker", 2)
        for info in infos:
            assert info["type"] == "io.nats.micro.v1.info_response"
            assert info["description"] == "Answers asks."
            assert [(e["name"], e["subject"], e["queue_group"], e["metadata"]) for e in info["endpoints"]] == [
                ("t-ask", "t.ask", "workers", {"schema": "Ask"}),
                ("t-notes", "t.notes", "", {"schema": "Note"}),
            ]

        stats = await discover(nc, "$SRV.STATS", 2)
        asks = [e for s in stats for e in s["endpoints"] if e["subject"] == "t.ask"]
        assert sum(e["num_requests"] for e in asks) == 3
        assert sum(e["num_errors"] for e in asks) == 2  # the undecodable one and the one that raised
        for endpoint in asks:  # the queue group spread the asks: each keeps the last error it met
            last = endpoint["last_error"]
            assert last == "RuntimeError: asked to fail" or last.startswith("could not decode") or not last
        notes_stats = [e for s in stats for e in s["endpoints"] if e["subject"] == "t.notes"]
        assert [e["num_requests"] for e in notes_stats] == [1, 1]
        assert all(e["processing_time"] > 0 for e in asks + notes_stats if e["num_requests"])

        # One instance, by its id.
        one = pings[0]
        (info,) = await discover(nc, f"$SRV.INFO.worker.{one['id']}", 1)
        assert info["metadata"]["instance"] == one["metadata"]["instance"]
    finally:
        await nc.close()
        for bus in buses:
            await bus.close()


async def test_a_closed_subscription_leaves_the_service_info(nats_url):
    bus = await Bus.connect(nats_url, "closing")

    async def ignore(_message: Note, _reply_to) -> None:
        return None

    kept = await bus.subscribe("t.kept", Note, ignore)
    gone = await bus.subscribe("t.gone", Note, ignore)
    await bus.serve_as_service("closing", "0.1.0", "Closes one.", {})
    nc = await nats.connect(nats_url)
    try:
        await gone.close()
        (info,) = await discover(nc, "$SRV.INFO.closing", 1)
        assert [e["subject"] for e in info["endpoints"]] == ["t.kept"]
    finally:
        await kept.close()
        await nc.close()
        await bus.close()


async def test_gather_returns_every_listener_s_reply_at_once_when_all_came(nats_url):
    buses = [await Bus.connect(nats_url, name) for name in ("x", "y")]
    for bus, name in zip(buses, ("x", "y")):

        async def answer(_message: Ask, _reply_to, name=name) -> Told:
            return Told(name)

        await bus.subscribe("t.everyone", Ask, answer)
    asker = await Bus.connect(nats_url, "asker")
    try:
        started = time.monotonic()
        replies = await asker.gather("t.everyone", Ask(), Told, expected=2, timeout_s=5)
        assert sorted(r.by for r in replies) == ["x", "y"]
        assert time.monotonic() - started < 2  # did not wait out the timeout
        # Expecting more than answer: those that came, after the timeout.
        replies = await asker.gather("t.everyone", Ask(), Told, expected=3, timeout_s=0.3)
        assert sorted(r.by for r in replies) == ["x", "y"]
        assert await asker.gather("t.nobody", Ask(), Told, expected=1, timeout_s=0.2) == []
    finally:
        for bus in [*buses, asker]:
            await bus.close()
