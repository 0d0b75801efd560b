"""After a bus outage the scheduler follows the executor's latest epoch, whatever order the news of
two epochs arrives in. On a real nats-server, a stand-in executor answers the scheduler's resync
with one epoch, but first broadcasts the next one, which its own reconnection started: the reply of
the older epoch is handled last. The scheduler still ends up following the newer one."""

import argparse
import asyncio

from actors.scheduler.actor import SchedulerActor
from kernel.bus import Bus
from kernel.config import BusConfig, KernelConfig
from kernel.subjects import Subjects
from schemas.step import DescribeExecutor, ExecutorInfo


def epoch(executor_id: str) -> ExecutorInfo:
    return ExecutorInfo(executor_id, 64, 16, 256, 100, "cpu", "float32")


async def test_a_resync_answered_after_a_newer_epoch_is_broadcast_follows_the_newer(nats_url):
    subjects = Subjects()
    executor_bus = await Bus.connect(nats_url, "executor")
    scheduler_bus = await Bus.connect(nats_url, "scheduler")
    current = epoch("e1")

    async def on_describe(message: DescribeExecutor, _reply_to) -> ExecutorInfo:
        nonlocal current
        if message.resync:
            older, current = epoch("e2"), epoch("e3")  # the resync's epoch, then the reconnection's
            await executor_bus.publish(subjects.executor_info, current)
            await executor_bus.flush()
            await asyncio.sleep(0.2)  # the broadcast is handled before this reply
            return older
        return current

    await executor_bus.subscribe(subjects.executor_describe, DescribeExecutor, on_describe)
    scheduler = SchedulerActor(KernelConfig(bus=BusConfig(nats_url=nats_url)), scheduler_bus, argparse.Namespace())
    stop = asyncio.Event()
    running = asyncio.create_task(scheduler.run_until_stopped(stop))
    try:
        while getattr(scheduler, "executor_id", None) != "e1":
            await asyncio.sleep(0.01)
        await scheduler._find_executor(resync=True)
        assert scheduler.executor_id == "e3"
    finally:
        stop.set()
        await running
        await scheduler_bus.close()
        await executor_bus.close()
