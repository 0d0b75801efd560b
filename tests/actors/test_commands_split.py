"""The scheduler's commands cross the bus in as many messages as its payload limit needs: a round
of commands can carry three budgets of prompt tokens, over NATS's 1 MB at budgets near 70K tokens.
On a real nats-server with a small limit, every message fits it and the executor receives the
same commands in the same order, a prompt chunk too large alone cut into consecutive pieces."""

import argparse
import asyncio
import json

from actors.scheduler.actor import SchedulerActor
from kernel.bus import Bus, encode
from kernel.config import KernelConfig
from kernel.nats_server import EmbeddedNats
from kernel.subjects import Subjects
from schemas.step import Commands, PrefillChunk, StartSequence
from tests.sampling import greedy

MAX_PAYLOAD = 4096  # bytes; a token id from 256 up takes 3 bytes in msgpack


def merged(commands: list) -> list:
    """The commands with each run of consecutive chunks of one request joined back into one."""
    out = []
    for command in commands:
        last = out[-1] if out else None
        if (isinstance(command, PrefillChunk) and isinstance(last, PrefillChunk) and last.request_id == command.request_id
                and not last.last and last.start_position + len(last.token_ids) == command.start_position):
            out[-1] = PrefillChunk(last.request_id, last.token_ids + command.token_ids, last.start_position, command.last)
        else:
            out.append(command)
    return out


async def test_commands_over_the_payload_limit_arrive_whole_and_in_order(tmp_path):
    config_file = tmp_path / "nats.conf"
    config_file.write_text(json.dumps({"max_payload": MAX_PAYLOAD}))
    server = EmbeddedNats(tmp_path / "nats", config_file=config_file)
    await server.start()
    scheduler_bus = await Bus.connect(server.url, "scheduler")
    executor_bus = await Bus.connect(server.url, "executor")
    try:
        config = KernelConfig(nats_url=server.url)
        received: list[Commands] = []

        async def on_commands(message: Commands, _reply_to) -> None:
            received.append(message)

        await executor_bus.subscribe(Subjects(config.namespace).executor_commands, Commands, on_commands)
        scheduler = SchedulerActor(config, scheduler_bus, argparse.Namespace())
        scheduler.scheduler_id = "scheduler-1"
        long_prompt = [300 + i % 1700 for i in range(3000)]  # 9 KB: over the limit alone
        commands = [
            StartSequence("a", greedy(4), list(range(200, 400))),
            PrefillChunk("a", long_prompt, 0, last=True),
            StartSequence("b", greedy(4), [7, 8]),
            PrefillChunk("b", [300 + i for i in range(600)], 0, last=False),
            PrefillChunk("c", [500 + i for i in range(700)], 64, last=True),
        ]
        await scheduler._send(commands)
        for _ in range(200):
            if merged([c for m in received for c in m.commands]) == commands:
                break
            await asyncio.sleep(0.01)
        assert merged([c for m in received for c in m.commands]) == commands
        assert len(received) > 2 and all(m.scheduler_id == "scheduler-1" for m in received)
        assert all(len(encode(m)) <= MAX_PAYLOAD for m in received)
        pieces = [c for m in received for c in m.commands if isinstance(c, PrefillChunk) and c.request_id == "a"]
        assert len(pieces) > 1 and [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True]
    finally:
        await scheduler_bus.close()
        await executor_bus.close()
        await server.stop()
