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


@pytest.fixture
def cores(monkeypatch):
    """Sets the cores the process may run on, its cgroup setting no quota."""

    def set_cores(count: int) -> None:
        monkeypatch.setattr(busy_poll.os, "sched_getaffinity", lambda _pid: set(range(count)))
        monkeypatch.setattr(busy_poll, "usable_cores", lambda: float(count))

    return set_cores


@pytest.mark.parametrize(
    ("count", "device", "given", "window_s"),
    [
        (16, "cuda", None, 0.05),
        (16, "cuda:1", None, 0.05),
        (2, "cuda", None, 0.0),
        (16, "cpu", None, 0.0),
        (2, "cpu", 30.0, 0.03),
        (16, "cuda", 0.0, 0.0),
    ],
)
def test_the_window_by_device_and_cores_unless_given(cores, count, device, given, window_s):
    cores(count)
    assert busy_poll.window_s_for(given, device) == window_s


@pytest.mark.parametrize(
    ("nvidia_nodes", "visible", "window_s"),
    [
        (["/dev/nvidia0"], None, 0.05),
        (["/dev/nvidia0"], "1", 0.05),
        (["/dev/nvidia0"], "", 0.0),
        (["/dev/nvidia0"], "-1", 0.0),
        ([], None, 0.0),
    ],
)
def test_auto_polls_where_an_nvidia_device_is_visible(monkeypatch, cores, nvidia_nodes, visible, window_s):
    cores(16)
    monkeypatch.setattr(busy_poll.glob, "glob", lambda _pattern: nvidia_nodes)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert busy_poll.window_s_for(None, "auto") == window_s


@pytest.mark.parametrize(("cpu_max", "usable"), [("max 100000\n", 64.0), ("400000 100000\n", 4.0), (None, 64.0)])
def test_a_cgroup_quota_limits_the_cores(monkeypatch, tmp_path, cpu_max, usable):
    monkeypatch.setattr(busy_poll.os, "sched_getaffinity", lambda _pid: set(range(64)))
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    assert busy_poll.usable_cores(str(path)) == usable


async def thread_cpu_seconds_over(seconds: float) -> float:
    """This thread's CPU time while this coroutine waits `seconds`: the loop's own work, not the
    other threads' (other processes on a small machine may take some of it, not add to it)."""
    started = time.thread_time()
    await asyncio.sleep(seconds)
    return time.thread_time() - started


async def test_traffic_keeps_the_loop_busy_for_the_window_then_lets_it_sleep():
    poll = busy_poll.BusyPoll(WINDOW_S)
    task = asyncio.create_task(poll.run())
    try:
        assert await thread_cpu_seconds_over(0.1) < 0.005  # no traffic yet: the loop sleeps
        poll.note_traffic()
        busy = await thread_cpu_seconds_over(0.1)
        assert poll.polling and busy > 0.01, busy
        await asyncio.sleep(WINDOW_S)
        assert not poll.polling
        assert await thread_cpu_seconds_over(0.1) < 0.005
    finally:
        task.cancel()


async def test_the_bus_polls_after_a_message_but_not_a_heartbeat_or_an_unanswered_request(tmp_path):
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
        unanswered = await listener.request("test.nobody", Error("test", "anyone?"), Error, 1.0)
        assert unanswered.code == "unavailable"  # no responders: nothing came back
        await asyncio.sleep(0)
        assert not listener._busy_poll.polling
        await sender.publish("test.request", Error("test", "a request's message"))
        await asyncio.wait_for(arrived.get(), 5)
        await asyncio.sleep(0)  # the poller's turn
        assert listener._busy_poll.polling
        await asyncio.sleep(WINDOW_S * 1.5)
        assert not listener._busy_poll.polling
        await listener.publish("test.out", Error("test", "a step's tokens"))  # sending counts too
        await asyncio.sleep(0)
        assert listener._busy_poll.polling
    finally:
        poller.cancel()
        await sender.close()
        await listener.close()
        await server.stop()
