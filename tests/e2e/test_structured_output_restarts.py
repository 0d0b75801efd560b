"""Constrained streams across a kill -9 of the scheduler (the origins resubmit each request with the
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

from ops.local_server import start_server

REQUESTS = 8


class Item(BaseModel):
    name: str = Field(max_length=24)
    tags: list[Annotated[str, StringConstraints(max_length=8)]] = Field(max_length=4)
    count: int = Field(ge=0, le=999)


BODY = {
    "max_tokens": 400,
    "temperature": 1.0,
    "stream": True,
    "response_format": {"type": "json_schema", "json_schema": {"name": "item", "schema": Item.model_json_schema()}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("structured-restarts"), "--num-kv-blocks", "512")
    yield running
    running.stop()


async def stream_all(base_url: str, flowing: asyncio.Event | None = None) -> list[str]:
    """Each request's streamed text; `flowing` is set once a quarter of the requests' chunks came."""
    chunks = 0

    async def one(client: httpx.AsyncClient, i: int) -> str:
        nonlocal chunks
        body = BODY | {"messages": [{"role": "user", "content": f"item {i}"}], "seed": i}
        text = ""
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line.removeprefix("data: "))["choices"][0]
                    text += choice["delta"].get("content") or ""
                    chunks += 1
                    if flowing is not None and chunks >= REQUESTS * 4:
                        flowing.set()
        return text

    async with httpx.AsyncClient(base_url=base_url, timeout=180) as client:
        return await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))


@pytest.fixture(scope="module")
async def reference(server):
    texts = await stream_all(server.base_url)
    for text in texts:
        Item.model_validate_json(text)
    return texts


@pytest.mark.parametrize("actor", ["scheduler", "executor"])
async def test_constrained_streams_survive_a_kill(server, reference, actor):
    old_pid = server.process_pids()[actor]
    flowing = asyncio.Event()
    streams = asyncio.ensure_future(stream_all(server.base_url, flowing))
    await asyncio.wait_for(flowing.wait(), timeout=120)
    os.kill(old_pid, signal.SIGKILL)
    texts = await streams
    assert server.process_pids()[actor] != old_pid, "the process was not restarted"
    assert texts == reference
    if actor == "scheduler":  # the origins moved the requests, with what their clients had
        assert server.find("request_migrating")
