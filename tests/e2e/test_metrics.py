"""`/metrics` through the whole stack: scraped during and after a small load over HTTP (the openai
SDK) and over the bus (the gateway), its counts agree with what the clients got; and every actor
answers NATS's service discovery, as `nats micro ls`, `info` and `stats` ask it."""

import asyncio
import json
import random
import time

import httpx
import msgspec
import nats.errors
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernel.supervisor import ACTORS
from schemas.generate import GenerateRequest, GenerateResult, SamplingParams

HTTP_REQUESTS = 20
BUS_REQUESTS = 4
LABELS = {"model_name": "demo", "engine": "0"}


def scrape(base_url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a `/metrics` scrape, parsed by prometheus-client's own parser, by (name, labels)."""
    response = httpx.get(f"{base_url}/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted((LABELS | labels).items()))]


async def http_request(client: openai.AsyncOpenAI, i: int) -> tuple[int, int]:
    """One request of the load (chat or completion, whole or streamed); its usage."""
    args = dict(model="demo", max_tokens=random.randint(3, 12), temperature=0.7, seed=i)
    args["extra_body"] = {"ignore_eos": True}  # a first token always comes: every request has a TTFT
    stream = i % 2 == 1
    if i % 4 < 2:
        call = client.chat.completions.create
        args["messages"] = [{"role": "user", "content": f"Question {i}: why is the sky blue?"}]
    else:
        call = client.completions.create
        args["prompt"] = f"Story {i}: once upon a time"
    if not stream:
        reply = await call(**args)
        return reply.usage.prompt_tokens, reply.usage.completion_tokens
    usage = None
    async for chunk in await call(**args, stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
    return usage.prompt_tokens, usage.completion_tokens


async def bus_request(nc, i: int) -> tuple[int, int]:
    params = SamplingParams(max_tokens=5 + i, temperature=0, ignore_eos=True)
    message = msgspec.msgpack.encode(GenerateRequest(text=f"Bus {i}", params=params))
    reply = msgspec.msgpack.decode((await nc.request("llm.generate", message, timeout=60)).data, type=GenerateResult)
    return reply.prompt_tokens, reply.completion_tokens


async def test_metrics_scraped_during_a_load_agree_with_what_the_clients_got(server):
    before = scrape(server.base_url)
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    nc = await server.connect_nats()
    try:
        load = asyncio.gather(
            *(http_request(client, i) for i in range(HTTP_REQUESTS)),
            *(bus_request(nc, i) for i in range(BUS_REQUESTS)),
        )
        during = await asyncio.to_thread(scrape, server.base_url)  # while the requests run
        usages = await load
    finally:
        await client.close()
        await nc.drain()
    sent = HTTP_REQUESTS + BUS_REQUESTS
    ended = value(during, "vllm:request_success_total", finished_reason="length")
    ended -= value(before, "vllm:request_success_total", finished_reason="length")
    first_tokens = value(during, "vllm:time_to_first_token_seconds_count")
    first_tokens -= value(before, "vllm:time_to_first_token_seconds_count")
    assert 0 <= ended <= first_tokens <= sent  # mid-load: each request that ended had its first token

    # The scheduler books a request's end after its client has it: wait until it is idle again.
    deadline = time.monotonic() + 30
    while True:
        after = scrape(server.base_url)
        idle = value(after, "vllm:num_requests_running") + value(after, "vllm:num_requests_waiting") == 0
        if idle and value(after, "vllm:kv_cache_usage_perc") == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:num_requests_waiting") == 0
    assert value(after, "vllm:kv_cache_usage_perc") == 0  # what finished is cached, and evictable

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # Every request counted once, whichever origin (the frontdoor, the gateway) took it.
    assert grew("vllm:request_success_total", finished_reason="length") == sent
    assert sum(grew("vllm:request_success_total", finished_reason=r) for r in ("stop", "abort", "error")) == 0
    assert grew("vllm:prompt_tokens_total") == sum(prompt for prompt, _ in usages)
    assert grew("vllm:generation_tokens_total") == sum(generated for _, generated in usages)
    assert grew("vllm:time_to_first_token_seconds_count") == sent
    assert grew("vllm:e2e_request_latency_seconds_count") == sent
    assert grew("vllm:request_generation_tokens_sum") == sum(generated for _, generated in usages)
    later_tokens = sum(generated - 1 for _, generated in usages)
    assert 0 < grew("vllm:inter_token_latency_seconds_count") <= later_tokens  # a delivery may carry several
    assert grew("vllm:inter_token_latency_seconds_count") == grew("vllm:time_per_output_token_seconds_count")
    assert grew("vllm:time_to_first_token_seconds_bucket", le="+Inf") == sent
    assert value(after, "kernel_llm:origins_reporting") == 2  # the frontdoor and the gateway
    assert value(after, "kernel_llm:origin_requests_in_flight") == 0
    assert grew("vllm:prefix_cache_queries_total") > 0
    assert 0 <= grew("vllm:prefix_cache_hits_total") <= grew("vllm:prefix_cache_queries_total")
    assert grew("kernel_llm:executor_steps_total") > 0
    assert value(after, "kernel_llm:weight_version_info", version="default") == 1
    for source in ("scheduler", "executor"):
        assert value(after, "kernel_llm:metrics_source_up", source=source) == 1
    # No subscription or reply that discovery and the figures need was refused by the bus's permissions.
    assert not [e for e in server.events if "ermission" in e.get("error", "")]


async def discover(nc, subject: str, until: set[str]) -> list[dict]:
    """As the `nats` CLI does: one request on a `$SRV` subject, replies collected for a while."""
    inbox = nc.new_inbox()
    subscription = await nc.subscribe(inbox)
    await nc.publish(subject, b"", reply=inbox)
    replies = []
    deadline = time.monotonic() + 10
    while not until <= {reply["name"] for reply in replies} and time.monotonic() < deadline:
        try:
            replies.append(json.loads((await subscription.next_msg(timeout=deadline - time.monotonic())).data))
        except nats.errors.TimeoutError:
            break
    await subscription.unsubscribe()
    return replies


@pytest.mark.parametrize("verb", ["PING", "INFO", "STATS"])
async def test_every_actor_answers_service_discovery(server, verb):
    nc = await server.connect_nats()
    try:
        replies = await discover(nc, f"$SRV.{verb}", set(ACTORS))
    finally:
        await nc.drain()
    by_name = {reply["name"]: reply for reply in replies}
    assert set(by_name) == set(ACTORS)
    for reply in by_name.values():
        assert reply["type"] == f"io.nats.micro.v1.{verb.lower()}_response"
        assert reply["version"] == "0.1.0"
        assert reply["metadata"]["namespace"] == "llm" and reply["metadata"]["instance"]
    if verb == "INFO":
        assert {"llm.scheduler.requests", "llm.admin.stats"} <= {
            e["subject"] for e in by_name["scheduler"]["endpoints"]
        }
        assert ("llm.generate", "gateways") in {
            (e["subject"], e["queue_group"]) for e in by_name["gateway"]["endpoints"]
        }
    if verb == "STATS":  # the shared server has run requests by now, or the executor's describe at least
        executor = {e["subject"]: e for e in by_name["executor"]["endpoints"]}
        assert executor["llm.executor.describe"]["num_requests"] > 0
