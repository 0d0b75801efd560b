"""The scheduler's commands cross the bus in as many messages as its payload limit needs: a round
of commands can carry three budgets of prompt tokens, over NATS's 1 MB at budgets near 70K tokens.
On a real nats-server, every message fits the limit, and a subscriber on the executor's subject
receives the same commands in the same order, another round's included."""

import argparse
import asyncio
import json

import pytest

from actors.scheduler.actor import SchedulerActor
from kernel.bus import Bus
from kernel.bus_codec import encode
from kernel.config import BusConfig, KernelConfig
from kernel.nats_server import EmbeddedNats
from kernel.subjects import Subjects
from schemas.step import Commands, DropSequence, PrefillChunk, StartSequence
from tests.sampling import greedy


@pytest.fixture
async def started_scheduler(tmp_path, request):
    """A scheduler actor started on a nats-server whose max_payload is `request.param` bytes (no
    executor: it keeps asking for one), and the commands a subscriber on the executor's subject receives."""
    config_file = tmp_path / "nats.conf"
    config_file.write_text(json.dumps({"max_payload": request.param}))
    server = EmbeddedNats(tmp_path / "nats", config_file=config_file)
    await server.start()
    scheduler_bus = await Bus.connect(server.url, "scheduler")
    executor_bus = await Bus.connect(server.url, "executor")
    config = KernelConfig(bus=BusConfig(nats_url=server.url))
    received: list[Commands] = []

    async def on_commands(message: Commands, _reply_to) -> None:
        received.append(message)

    await executor_bus.subscribe(Subjects(config.bus.namespace).executor_commands, Commands, on_commands)
    scheduler = SchedulerActor(config, scheduler_bus, argparse.Namespace())
    stop = asyncio.Event()
    running = asyncio.create_task(scheduler.run_until_stopped(stop))
    while not hasattr(scheduler, "scheduler_id"):
        await asyncio.sleep(0.01)
    try:
        yield scheduler, received
    finally:
        stop.set()
        await running
        await scheduler_bus.close()
        await executor_bus.close()
        await server.stop()


async def all_received(received: list[Commands], count: int) -> list:
    for _ in range(500):
        commands = [c for message in received for c in message.commands]
        if len(commands) >= count:
            return commands
        await asyncio.sleep(0.01)
    raise TimeoutError(f"{count} commands did not arrive")


def chunk(request_id: str, tokens: int) -> PrefillChunk:
    return PrefillChunk(request_id, [300 + i % 1700 for i in range(tokens)], 0, last=True)  # 3 bytes a token


@pytest.mark.parametrize("started_scheduler", [4096], indirect=True)
async def test_a_round_over_the_limit_arrives_whole_and_in_order(started_scheduler):
    scheduler, received = started_scheduler
    commands = [
        StartSequence("a", greedy(4), list(range(200, 400))),
        chunk("a", 1200),
        StartSequence("b", greedy(4), [7, 8]),
        chunk("b", 600),
        chunk("c", 700),
        DropSequence("d"),
    ]
    await scheduler._send(commands)
    assert await all_received(received, len(commands)) == commands
    assert len(received) > 2 and all(m.scheduler_id == scheduler.scheduler_id for m in received)
    assert all(len(encode(m)) <= 4096 for m in received)


@pytest.mark.parametrize("started_scheduler", [1024 * 1024], indirect=True)
async def test_another_round_waits_for_the_parts_of_the_one_going_out(started_scheduler):
    """nats-py's publish waits once its buffer passes 2 MB: a round sent meanwhile must not slip in
    between the parts of one that is going out (its chunks would run before the ones they follow)."""
    scheduler, received = started_scheduler
    big = [chunk(f"big-{i}", 300_000) for i in range(4)]  # 900 KB each: a part each
    small = [DropSequence("small")]
    await asyncio.gather(scheduler._send(big), scheduler._send(small))
    assert await all_received(received, len(big) + len(small)) == big + small
