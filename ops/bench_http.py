"""The benchmark's HTTP clients: streaming requests to the native `/generate` with token-id prompts
(the prompts are random ids, and its stream carries the token ids of every step, so each token is
counted and timed even when it decodes to no text), `concurrency` of them in flight at a time.
With `detokenize` off they ask for token ids alone, as the in-process engine produces them.
"""

import asyncio
import dataclasses
import json
import time

import aiohttp

from ops.bench_requests import BenchRequest, RequestTiming, Sampling, summarize


class BenchRequestFailed(RuntimeError):
    """The server answered a benchmark request with an error, or with fewer tokens than asked for."""


async def stream_one(
    session: aiohttp.ClientSession, base_url: str, request: BenchRequest, sampling: Sampling, detokenize: bool
) -> RequestTiming:
    sampling_params = {"max_new_tokens": request.output_tokens, "ignore_eos": True, "detokenize": detokenize,
                       **sampling.fields()}
    body = {"input_ids": request.prompt_ids, "sampling_params": sampling_params, "stream": True}
    chunks: list[tuple[float, int]] = []
    started = time.perf_counter()
    async with session.post(f"{base_url}/generate", json=body) as response:
        taken_s = time.perf_counter() - started  # a stream's headers leave once the request is submitted
        if response.status != 200:
            raise BenchRequestFailed(f"HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[len(b"data: "):].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                raise BenchRequestFailed(f"error in the stream: {event['error']}")
            if event["token_ids"]:
                chunks.append((time.perf_counter(), len(event["token_ids"])))
    timing = RequestTiming.from_chunks(started, chunks)
    if timing.output_tokens != request.output_tokens:
        raise BenchRequestFailed(f"asked for {request.output_tokens} tokens, got {timing.output_tokens}")
    return dataclasses.replace(timing, taken_s=taken_s)


async def run_clients(
    base_url: str, requests: list[BenchRequest], concurrency: int, sampling: Sampling, detokenize: bool = True
) -> dict:
    """Sends `requests` in order from `concurrency` clients, each sending its next request when its
    last one ends (a closed loop); returns the figures of the run (see bench_requests.summarize)."""
    pending = iter(requests)
    timings: list[RequestTiming] = []

    async def client(session: aiohttp.ClientSession) -> None:
        for request in pending:  # one iterator shared by the clients: each request is sent once
            timings.append(await stream_one(session, base_url, request, sampling, detokenize))

    connector = aiohttp.TCPConnector(limit=concurrency)  # aiohttp's default of 100 would cap the load
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        started = time.perf_counter()
        async with asyncio.TaskGroup() as clients:
            for _ in range(min(concurrency, len(requests))):
                clients.create_task(client(session))
        seconds = time.perf_counter() - started
    return summarize(timings, seconds, concurrency)


async def admin(base_url: str, method: str, route: str) -> dict:
    """The answer of an admin route (`/admin/stats`, `/admin/flush_cache`: the server has no admin key)."""
    async with aiohttp.ClientSession() as session, session.request(method, f"{base_url}{route}") as response:
        if response.status != 200:
            raise BenchRequestFailed(f"{method} {route}: HTTP {response.status}: {await response.text()}")
        return await response.json()
