"""After request traffic on the bus, an actor's loop polls (it keeps a core busy) for the window and
then sleeps again; heartbeats do not wake it, and by default only actors serving a model on a GPU
on a machine with many cores poll."""

import asyncio
import time

import pytest

from kernel import busy_poll
from kernel.bus import Bus
from kernel.nats_server import EmbeddedNats
from schemas.errors import Error
from schemas.health import Heartbeat

WINDOW_S = 0.2


@pytest.mark.parametrize(("cores", "device", "given", "window_s"), [
    (16, "cuda", None, 0.05), (16, "cuda:1", None, 0.05), (2, "cuda", None, 0.0), (16, "cpu", None, 0.0),
    (2, "cpu", 30.0, 0.03), (16, "cuda", 0.0, 0.0),
])
def test_the_window_by_device_and_cores_unless_given(monkeypatch, cores, device, given, window_s):
    monkeypatch.setattr(busy_poll.os, "sched_getaffinity", lambda _pid: set(range(cores)))
    assert busy_poll.window_s_for(given, device) == window_s


@pytest.mark.parametrize(("nvidia_nodes", "window_s"), [(["/dev/nvidia0"], 0.05), ([], 0.0)])
def test_auto_polls_where_an_nvidia_device_is(monkeypatch, nvidia_nodes, window_s):
    monkeypatch.setattr(busy_poll.os, "sched_getaffinity", lambda _pid: set(range(16)))
    monkeypatch.setattr(busy_poll.glob, "glob", lambda _pattern: nvidia_nodes)
    assert busy_poll.window_s_for(None, "auto") == window_s


async def cpu_seconds_over(seconds: float) -> float:
    """The process's CPU time while this coroutine waits `seconds` (its loop is otherwise idle)."""
    started = time.process_time()
    await asyncio.sleep(seconds)
    return time.process_time() - started


async def test_traffic_keeps_the_loop_busy_for_the_window_then_lets_it_sleep():
    poll = busy_poll.BusyPoll(WINDOW_S)
    task = asyncio.create_task(poll.run())
    try:
        assert await cpu_seconds_over(0.1) < 0.03  # no traffic yet: the loop sleeps
        poll.note_traffic()
        busy = await cpu_seconds_over(0.1)
        assert poll.polling and busy > 0.05, busy
        await asyncio.sleep(WINDOW_S)
        assert not poll.polling
        assert await cpu_seconds_over(0.1) < 0.03
    finally:
        task.cancel()


async def test_the_bus_polls_after_a_request_message_but_not_after_a_heartbeat(tmp_path):
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    listener, sender = await Bus.connect(server.url, "listener"), await Bus.connect(server.url, "sender")
    poller = asyncio.create_task(listener.poll_after_traffic(WINDOW_S))
    arrived = asyncio.Queue()

    async def handler(message, _reply_to) -> None:
        arrived.put_nowait(message)

    try:
        await listener.subscribe("test.beat", Heartbeat, handler)
        await listener.subscribe("test.request", Error, handler)
        await sender.publish("test.beat", Heartbeat("tokenizer", "t1", 1, True, 1.0))
        await asyncio.wait_for(arrived.get(), 5)
        assert not listener._busy_poll.polling
        await sender.publish("test.request", Error("test", "a request's message"))
        await asyncio.wait_for(arrived.get(), 5)
        await asyncio.sleep(0)  # the poller's turn
        assert listener._busy_poll.polling
        await asyncio.sleep(WINDOW_S * 1.5)
        assert not listener._busy_poll.polling
    finally:
        poller.cancel()
        await sender.close()
        await listener.close()
        await server.stop()
