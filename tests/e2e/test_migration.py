"""Kill -9 an actor under load: every request completes, with no token lost or repeated, and the
same output as an uninterrupted run (greedy and seeded sampling alike)."""

import asyncio
import os
import signal

import msgspec
import nats
import pytest
from openai import AsyncOpenAI

from schemas.errors import Error
from schemas.generate import GenerateChunk, GenerateRequest, GenerateResult, SamplingParams
from tests.e2e.server import start_server

NUM_REQUESTS = 32
MAX_TOKENS = 24
Reply = GenerateChunk | GenerateResult | Error


@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("faults"), "--num-kv-blocks", "512")
    yield running
    running.stop()


def workload() -> list[dict]:
    """Half greedy, half seeded; prompts of different lengths."""
    return [
        {"prompt": f"Request {i}: " + "tell me more " * (i % 5), "seed": 1000 + i,
         "temperature": 0.0 if i % 2 == 0 else 0.8}
        for i in range(NUM_REQUESTS)
    ]


async def over_http(base_url: str, item: dict, progress: asyncio.Event) -> tuple[str, int]:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    stream = await client.completions.create(
        model="demo", prompt=item["prompt"], max_tokens=MAX_TOKENS, temperature=item["temperature"], seed=item["seed"],
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, tokens = [], None
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].text)
            progress.set()
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    await client.close()
    return "".join(text), tokens


async def over_bus(nc, item: dict, progress: asyncio.Event) -> tuple[str, list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=item["temperature"], seed=item["seed"], ignore_eos=True)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish("llm.generate", msgspec.msgpack.encode(GenerateRequest(text=item["prompt"], params=params, stream=True)), reply=inbox)
    chunks = []
    while True:
        reply = msgspec.msgpack.decode((await sub.next_msg(timeout=120)).data, type=Reply)
        assert not isinstance(reply, Error), reply
        if isinstance(reply, GenerateResult):
            break
        chunks.append(reply)
        progress.set()
    await sub.unsubscribe()
    assert [c.sequence for c in chunks] == list(range(len(chunks))), "a chunk was lost or repeated"
    streamed = [t for c in chunks for t in c.token_ids]
    assert streamed == reply.token_ids
    assert "".join(c.text for c in chunks) == reply.text
    return reply.text, streamed


async def run_workload(server, kill=None):
    nc = await nats.connect(server.nats_url)
    progress = asyncio.Event()
    items = workload()
    tasks = [
        over_http(server.base_url, item, progress) if i % 2 else over_bus(nc, item, progress)
        for i, item in enumerate(items)
    ]
    gathered = asyncio.gather(*tasks)
    if kill:
        await progress.wait()
        await asyncio.sleep(0.3)  # well inside the streams: each runs for seconds
        kill()
    results = await gathered
    await nc.drain()
    return results


@pytest.fixture(scope="module")
async def reference(faulty_server):
    """The same workload, uninterrupted."""
    return await run_workload(faulty_server)


@pytest.mark.parametrize("actor", ["tokenizer", "scheduler", "executor"])
async def test_kill_under_load_loses_nothing(faulty_server, reference, actor):
    old_pid = faulty_server.child_pid(actor)
    results = await run_workload(faulty_server, kill=lambda: os.kill(old_pid, signal.SIGKILL))
    assert faulty_server.child_pid(actor) != old_pid, "the actor was not restarted"
    for i, (got, want) in enumerate(zip(results, reference)):
        assert got == want, f"request {i} differs after the {actor} was killed"
    for i in range(1, NUM_REQUESTS, 2):
        assert results[i][1] == MAX_TOKENS
    if actor != "executor":  # the scheduler recomputes an executor's work itself; the origin moves the rest
        assert faulty_server.find("request_migrating")
