"""The benchmark's HTTP clients: streaming requests to the native `/generate` with token-id prompts
(the prompts are random ids, and its stream carries the token ids of every step, so each token is
counted and timed even when it decodes to no text), `concurrency` of them in flight at a time.
With `detokenize` off they ask for token ids alone, as the in-process engine produces them.

The clock starts with the clients ready, as the in-process engine's starts with every request
submitted: their bodies encoded and their connections open. Making both in the run held back d's
burst of 256 requests on the CPU box: at a server that answers at once, the first arrived 85-126 ms
after the clock's start and the last 97-139 ms, against 15-24 and 27-47 ms with both made before.
"""

import asyncio
import dataclasses
import json
import time

import aiohttp

from ops.bench.records import RunFigures
from ops.bench.requests import BenchRequest, RequestTiming, Sampling, summarize

JSON_CONTENT = {"Content-Type": "application/json"}


class BenchRequestFailed(RuntimeError):
    """The server answered a benchmark request with an error, or with fewer tokens than asked for."""


def request_body(request: BenchRequest, sampling: Sampling, detokenize: bool) -> bytes:
    sampling_params = {
        "max_new_tokens": request.output_tokens,
        "ignore_eos": True,
        "detokenize": detokenize,
        **sampling.fields(),
    }
    return json.dumps({"input_ids": request.prompt_ids, "sampling_params": sampling_params, "stream": True}).encode()


async def stream_one(session: aiohttp.ClientSession, base_url: str, body: bytes, output_tokens: int) -> RequestTiming:
    chunks: list[tuple[float, int]] = []
    started = time.perf_counter()
    async with session.post(f"{base_url}/generate", data=body, headers=JSON_CONTENT) as response:
        taken_s = time.perf_counter() - started  # a stream's headers leave once the request is submitted
        if response.status != 200:
            raise BenchRequestFailed(f"HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[len(b"data: ") :].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                raise BenchRequestFailed(f"error in the stream: {event['error']}")
            if event["output_ids"]:  # the server streams incrementally (ops/bench/system.py)
                chunks.append((time.perf_counter(), len(event["output_ids"])))
    timing = RequestTiming.from_chunks(started, chunks)
    if timing.output_tokens != output_tokens:
        raise BenchRequestFailed(f"asked for {output_tokens} tokens, got {timing.output_tokens}")
    return dataclasses.replace(timing, taken_s=taken_s)


async def run_clients(
    base_url: str, requests: list[BenchRequest], concurrency: int, sampling: Sampling, detokenize: bool = True
) -> RunFigures:
    """Sends `requests` in order from `concurrency` clients, each sending its next request when its
    last one ends (a closed loop); returns the figures of the run (see requests.summarize)."""
    pending = iter([(request_body(r, sampling, detokenize), r.output_tokens) for r in requests])
    timings: list[RequestTiming] = []
    clients = min(concurrency, len(requests))

    async def client(session: aiohttp.ClientSession) -> None:
        for body, output_tokens in pending:  # one iterator shared by the clients: each request is sent once
            timings.append(await stream_one(session, base_url, body, output_tokens))

    connector = aiohttp.TCPConnector(limit=concurrency)  # aiohttp's default of 100 would cap the load
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        await open_connections(session, base_url, clients)
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(clients):
                group.create_task(client(session))
        seconds = time.perf_counter() - started
    return summarize(timings, seconds, concurrency, requests)


async def open_connections(session: aiohttp.ClientSession, base_url: str, count: int) -> None:
    """Leaves `count` open keep-alive connections in the session's pool: as many health checks at once."""

    async def check() -> None:
        async with session.get(f"{base_url}/health") as response:
            await response.read()

    await asyncio.gather(*(check() for _ in range(count)))


async def admin(base_url: str, method: str, route: str) -> dict:
    """The answer of an admin route (`/admin/stats`, `/admin/flush_cache`: the server has no admin key)."""
    async with aiohttp.ClientSession() as session, session.request(method, f"{base_url}{route}") as response:
        if response.status != 200:
            raise BenchRequestFailed(f"{method} {route}: HTTP {response.status}: {await response.text()}")
        return await response.json()
