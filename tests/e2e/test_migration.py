"""Kill -9 an actor, or the nats-server, under load: every request completes, with no token lost or
repeated, and the same output as an uninterrupted run (greedy and seeded sampling alike).

Constrained streams across a kill -9 of the scheduler (the origins resubmit each request with the
tokens its client has) or of the executor (the scheduler recomputes each with its outputs so far):
the new runs replay those tokens into their grammars, so every reply is the uninterrupted run's,
token for token, and still follows its schema."""

import asyncio
import json
import os
import signal
from typing import Annotated

import httpx
import pytest
from pydantic import BaseModel, Field, StringConstraints

from ops.fault_drill import compare, failures, run_workload
from ops.local_server import start_server

NUM_REQUESTS = 32
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory):
    # Two tokenizers: killing one moves its streams to the other (a queue group).
    running = start_server(tmp_path_factory.mktemp("faults"), "--num-kv-blocks", "512", "--tokenizers", "2")
    yield running
    running.stop()


@pytest.fixture(scope="module")
async def reference(faulty_server):
    """The same workload, uninterrupted."""
    logs, _ = await run_workload(faulty_server, NUM_REQUESTS, MAX_TOKENS)
    assert not failures(logs)
    return logs


@pytest.mark.parametrize("actor", ["tokenizer", "scheduler", "executor", "nats-server"])
async def test_kill_under_load_loses_nothing(faulty_server, reference, actor):
    old_pid = faulty_server.process_pids()[actor]
    logs, _ = await run_workload(faulty_server, NUM_REQUESTS, MAX_TOKENS, kill=lambda: os.kill(old_pid, signal.SIGKILL))
    assert faulty_server.process_pids()[actor] != old_pid, "the process was not restarted"
    assert not failures(logs)
    assert compare(reference, logs) == (0, 0)
    assert all(log.completion_tokens == MAX_TOKENS for log in logs)
    if actor in ("tokenizer", "scheduler"):  # the scheduler recomputes an executor's work itself
        assert faulty_server.find("request_migrating")
    if actor == "tokenizer":  # only the requests it tracked move; those without text it never saw
        migrated = {event["request_id"] for event in faulty_server.find("request_migrating")}
        assert not migrated & {log.request_id for log in logs if not log.detokenize}


CONSTRAINED_REQUESTS = 8


class Item(BaseModel):
    name: str = Field(max_length=24)
    tags: list[Annotated[str, StringConstraints(max_length=8)]] = Field(max_length=4)
    count: int = Field(ge=0, le=999)


CONSTRAINED = {
    "max_tokens": 400,
    "temperature": 1.0,
    "stream": True,
    "response_format": {"type": "json_schema", "json_schema": {"name": "item", "schema": Item.model_json_schema()}},
}


async def stream_constrained(base_url: str, flowing: asyncio.Event | None = None) -> list[str]:
    """Each request's streamed text; `flowing` is set once a quarter of the requests' chunks came."""
    chunks = 0

    async def one(client: httpx.AsyncClient, i: int) -> str:
        nonlocal chunks
        body = CONSTRAINED | {"messages": [{"role": "user", "content": f"item {i}"}], "seed": i}
        text = ""
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line.removeprefix("data: "))["choices"][0]
                    text += choice["delta"].get("content") or ""
                    chunks += 1
                    if flowing is not None and chunks >= CONSTRAINED_REQUESTS * 4:
                        flowing.set()
        return text

    async with httpx.AsyncClient(base_url=base_url, timeout=180) as client:
        return await asyncio.gather(*(one(client, i) for i in range(CONSTRAINED_REQUESTS)))


@pytest.fixture(scope="module")
async def constrained_reference(faulty_server):
    texts = await stream_constrained(faulty_server.base_url)
    for text in texts:
        Item.model_validate_json(text)
    return texts


@pytest.mark.parametrize("actor", ["scheduler", "executor"])
async def test_constrained_streams_survive_a_kill(faulty_server, constrained_reference, actor):
    old_pid = faulty_server.process_pids()[actor]
    migrating = len(faulty_server.find("request_migrating"))
    flowing = asyncio.Event()
    streams = asyncio.ensure_future(stream_constrained(faulty_server.base_url, flowing))
    await asyncio.wait_for(flowing.wait(), timeout=120)
    os.kill(old_pid, signal.SIGKILL)
    texts = await streams
    assert faulty_server.process_pids()[actor] != old_pid, "the process was not restarted"
    assert texts == constrained_reference
    if actor == "scheduler":  # the origins moved the requests, with what their clients had
        assert len(faulty_server.find("request_migrating")) > migrating
