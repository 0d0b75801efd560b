"""After a bus outage the scheduler follows the executor's latest epoch, whatever order the news of
two epochs arrives in. On a real nats-server, a stand-in executor answers the scheduler's resync
with one epoch, but first broadcasts the next one, which its own reconnection started: the reply of
the older epoch is handled last. The scheduler still ends up following the newer one. And an epoch
whose broadcast is lost altogether is found from its step outputs."""

import argparse
import asyncio
import contextlib

from actors.scheduler.actor import SchedulerActor
from kernel.bus import Bus
from kernel.config import BusConfig, KernelConfig
from kernel.subjects import Subjects
from schemas.step import DescribeExecutor, ExecutorInfo, StepOutput


def epoch(executor_id: str) -> ExecutorInfo:
    return ExecutorInfo(executor_id, 64, 16, 256, 100, "cpu", "float32")


@contextlib.asynccontextmanager
async def scheduler_following_e1(nats_url: str, executor_bus: Bus, on_describe):
    """A scheduler on a bus connection of its own, once it follows the stand-in executor's first
    epoch (e1), whose describes `on_describe` answers on `executor_bus`."""
    await executor_bus.subscribe(Subjects().executor_describe, DescribeExecutor, on_describe)
    scheduler_bus = await Bus.connect(nats_url, "scheduler")
    scheduler = SchedulerActor(KernelConfig(bus=BusConfig(nats_url=nats_url)), scheduler_bus, argparse.Namespace())
    stop = asyncio.Event()
    running = asyncio.create_task(scheduler.run_until_stopped(stop))
    try:
        while (scheduler.epochs.executor_id if hasattr(scheduler, "epochs") else None) != "e1":
            await asyncio.sleep(0.01)
        yield scheduler
    finally:
        stop.set()
        await running
        await scheduler_bus.close()


async def test_a_resync_answered_after_a_newer_epoch_is_broadcast_follows_the_newer(nats_url):
    subjects = Subjects()
    executor_bus = await Bus.connect(nats_url, "executor")
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

    try:
        async with scheduler_following_e1(nats_url, executor_bus, on_describe) as scheduler:
            await scheduler.epochs.find(resync=True)
            assert scheduler.epochs.executor_id == "e3"
    finally:
        await executor_bus.close()


async def test_an_output_of_an_epoch_whose_broadcast_was_lost_makes_the_scheduler_follow_it(nats_url):
    executor_bus = await Bus.connect(nats_url, "executor")
    current = epoch("e1")

    async def on_describe(_message: DescribeExecutor, _reply_to) -> ExecutorInfo:
        return current

    try:
        async with scheduler_following_e1(nats_url, executor_bus, on_describe) as scheduler:
            current = epoch("e2")  # a new epoch, its broadcast lost: only its outputs tell of it
            async with asyncio.timeout(5):
                while scheduler.epochs.executor_id != "e2":
                    await executor_bus.publish(Subjects().step_outputs, StepOutput("e2", 1, []))
                    await asyncio.sleep(0.05)
    finally:
        await executor_bus.close()
