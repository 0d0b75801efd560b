"""slime's and AReaL's own SGLang call sequences around a weight update and a sleep, unchanged
(tests/e2e/weight_clients.py), against the real server while their rollouts run: pause, flush
(retried while a request runs), update from disk, the version check, continue; release and resume
memory, whole or by tag. Nothing a rollout drew is lost, and what comes after is what the new
weights generate, under their version.

The server here is this module's own: the updates would change what other modules' servers answer."""

import asyncio

import aiohttp
import httpx
import pytest

from gpu.model_builder import build_model_dir
from ops.local_server import start_server
from tests.e2e.rl_clients import ArealClient
from tests.e2e.slime_client import SlimeSample, slime_generate, slime_http, slime_sampling_params
from tests.e2e.weight_clients import ArealServer, SlimeEngine, slime_reload_from_disk

PROMPT = [12, 40, 7, 99, 31, 64, 5, 250]
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def rl_server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("rl-weights"), "--num-kv-blocks", "256")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, rl_server) -> tuple[str, str]:
    """The served checkpoint and one of the same architecture with other weights."""
    other = build_model_dir(tmp_path_factory.mktemp("rl-other") / "demo-seed2", seed=2)
    return str(rl_server.model_dir), str(other)


def greedy(base_url: str, max_new_tokens: int = 16) -> dict:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": max_new_tokens, **GREEDY}}
    return httpx.post(f"{base_url}/generate", json=body, timeout=120).json()


async def test_slime_reloads_weights_from_disk_mid_rollout(rl_server, checkpoints):
    served, other = checkpoints
    url = rl_server.base_url
    before = greedy(url)
    engine = SlimeEngine(url)
    async with slime_http() as http:
        samples = [SlimeSample(tokens=PROMPT + [i]) for i in range(4)]
        budget = 900  # seconds of drawing at a few ms a token (and within the 256 blocks): the pause comes mid-way
        params = slime_sampling_params(budget, temperature=0, ignore_eos=True)
        rollouts = [asyncio.create_task(slime_generate(http, url, s, params)) for s in samples]
        await until_running(url, len(rollouts))
        await asyncio.sleep(1.0)  # and drawing: slime's generate does not stream, so give them time
        assert await asyncio.to_thread(slime_reload_from_disk, engine, other, "7") == "7"
        await asyncio.gather(*rollouts)
    for sample in samples:  # slime's pause aborts: each keeps what it drew, for its partial rollout
        assert sample.status == "aborted" and sample.response_length < budget
        assert len(sample.rollout_log_probs) == sample.response_length
    # One admitted last may be aborted before its first token; the others have drawn some.
    assert sum(sample.response_length > 0 for sample in samples) >= len(samples) - 1
    after = greedy(url)
    assert after["meta_info"]["weight_version"] == "7" and after["output_ids"] != before["output_ids"]
    assert await asyncio.to_thread(slime_reload_from_disk, engine, served, "8") == "8"
    assert greedy(url)["output_ids"] == before["output_ids"]


async def test_slime_flush_retries_while_a_rollout_runs_then_sleeps_and_wakes(rl_server):
    url = rl_server.base_url
    before = greedy(url)
    engine = SlimeEngine(url)
    async with slime_http() as http:
        sample = SlimeSample(tokens=PROMPT)
        rollout = asyncio.create_task(
            slime_generate(http, url, sample, slime_sampling_params(200, temperature=0, ignore_eos=True))
        )
        await until_running(url)
        released = await asyncio.to_thread(engine.release_memory_occupation)  # flush_cache first, until 200
        await rollout
    assert engine.flush_attempts > 1  # a 400 while the rollout ran, retried
    assert sample.status == "truncated" and sample.response_length == 200
    assert released["success"] is True and released["released"]
    assert (await asyncio.to_thread(engine.resume_memory_occupation))["released"] == []  # {"tags": null}: all
    assert greedy(url)["output_ids"] == before["output_ids"]
    # Multi-stage, as slime resumes after training: the weights, then the KV cache.
    await asyncio.to_thread(engine.release_memory_occupation)
    assert "weights" not in (await asyncio.to_thread(engine.resume_memory_occupation, ["weights"]))["released"]
    await asyncio.to_thread(engine.resume_memory_occupation, ["kv_cache"])
    assert greedy(url)["output_ids"] == before["output_ids"]


async def test_areal_updates_from_disk_while_its_rollouts_resubmit(rl_server, checkpoints):
    served, other = checkpoints
    url = rl_server.base_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        client, server = ArealClient(session, url), ArealServer(session, url)
        rollouts = [asyncio.create_task(client.agenerate(PROMPT + [i], 300, ignore_eos=True)) for i in range(4)]
        await until_running(url)
        updated = await server.update_from_disk(other)
        results = await asyncio.gather(*rollouts)
        assert updated["success"] is True
        for result in results:  # aborted by the pause, resubmitted by AReaL's loop: all 300 tokens
            assert result.stop_reason == "length" and len(result.output_tokens) == 300
            assert len(result.attempts) >= 2 and result.attempts[0][1] == "abort"
        new_version = greedy(url)["meta_info"]["weight_version"]
        assert new_version == updated["weight_version"] != "default"
        # Offload and onload around a training step: {} and {} (no tags: everything).
        offloaded = await server.offload()
        assert offloaded["success"] is True and set(offloaded["released"]) >= {"weights", "kv_cache"}
        onloaded = await server.onload()
        assert onloaded["released"] == []
        assert greedy(url)["meta_info"]["weight_version"] == new_version
        assert (await server.update_from_disk(served))["success"] is True


async def until_running(base_url: str, count: int = 1) -> None:
    async with httpx.AsyncClient(base_url=base_url) as http, asyncio.timeout(60):
        while (await http.get("/v1/loads")).json()["loads"][0]["num_running_reqs"] < count:
            await asyncio.sleep(0.01)
