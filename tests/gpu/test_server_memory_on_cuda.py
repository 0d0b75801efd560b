"""Sleep and wake, and the host KV tier, through a whole server on CUDA: what tests/e2e shows on the
CPU, where the memory is the process's own, shown here with the driver's account of the device.

- `/release_memory_occupation` hands the weights', the pool's and the graphs' memory back to the
  driver: another process (this test) sees that much more free memory; `/resume_memory_occupation`
  takes it again and the greedy tokens are transformers' as before.
- `--host-kv-blocks`: a prefix the GPU pool evicted comes back from the host segment, copied by
  gpu/kv_transfer.py on its own streams, and draws transformers' tokens.
- `--disk-kv-gb`: a prefix gone from the pool and the host comes back from the disk tier (the
  cache_tier actor reads it into host slots, the executor loads them), with transformers' tokens.
"""

import asyncio
import random

import httpx
import pytest
import torch

from actors.cache_tier.host_segment import remove_segments
from ops.local_server import start_server
from tests.devices import needs_cuda
from tests.over_http import generate_over_http, random_prompts

pytestmark = [pytest.mark.gpu, needs_cuda]

KV_BLOCKS = 40_000  # a pool of some hundreds of MB, so that its release is plain in the driver's count
POOL_BLOCKS = 24  # the host tier's server: room for about two of its prompts
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def model_dir(build_tiny_model):
    return build_tiny_model("llama")


def serve(data_dir, model_dir, *flags):
    return start_server(data_dir, "--device", "cuda", "--dtype", "float32", *flags, model=str(model_dir))


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    running = serve(tmp_path_factory.mktemp("sleep-cuda"), model_dir, "--num-kv-blocks", str(KV_BLOCKS))
    yield running
    running.stop()


def driver_free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


async def test_released_memory_goes_back_to_the_driver_and_wakes_to_the_same_tokens(server, model_dir, hf_greedy):
    prompt = random_prompts(1, seed=5, high=1000)[0]
    assert await generate_over_http(server.base_url, prompt, 24) == hf_greedy(model_dir, prompt, 24)
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        awake = http.post("/resume_memory_occupation", json={}).json()  # nothing released: the state
        free_awake = driver_free_bytes()
        asleep = http.post("/release_memory_occupation", json={}).json()
        free_asleep = driver_free_bytes()
        try:
            assert asleep["released"] == ["cuda_graph", "kv_cache", "weights"]
            handed_back = awake["device_bytes"] - asleep["device_bytes"]
            assert handed_back > KV_BLOCKS * BLOCK_SIZE * 2 * 4  # at least one layer's K and V in float32
            assert free_asleep - free_awake >= 0.9 * handed_back  # the driver has it, not torch's cache
            assert http.get("/is_sleeping").json() == {"is_sleeping": True}
        finally:
            woke = http.post("/resume_memory_occupation", json={"tags": None})
        assert woke.status_code == 200 and woke.json()["released"] == []
        assert driver_free_bytes() <= free_awake + 0.1 * handed_back  # taken again
    assert await generate_over_http(server.base_url, prompt, 24) == hf_greedy(model_dir, prompt, 24)


@pytest.fixture(scope="module")
def tiered(tmp_path_factory, model_dir):
    data_dir = tmp_path_factory.mktemp("host-tier-cuda")
    running = serve(data_dir, model_dir, "--num-kv-blocks", str(POOL_BLOCKS), "--host-kv-blocks", "96")
    yield running
    running.stop()
    remove_segments(data_dir)


async def test_a_prefix_evicted_from_the_pool_comes_back_from_the_host(tiered, model_dir, hf_greedy):
    rng = random.Random(9)
    length = POOL_BLOCKS * BLOCK_SIZE // 3 + 5  # a third of the pool each, and a partial block
    prompts = [[rng.randrange(10, 1000) for _ in range(length)] for _ in range(3)]
    first = [await generate_over_http(tiered.base_url, p, 8) for p in prompts]
    before = httpx.get(f"{tiered.base_url}/admin/cache", timeout=10).json()
    again = await generate_over_http(tiered.base_url, prompts[0], 8)  # its blocks left the pool
    after = httpx.get(f"{tiered.base_url}/admin/cache", timeout=10).json()
    host_hits = after["tiers"]["host"]["hits"] - before["tiers"]["host"]["hits"]
    assert host_hits >= len(prompts[0]) // BLOCK_SIZE - 1
    assert again == first[0] == hf_greedy(model_dir, prompts[0], 8)


@pytest.fixture(scope="module")
def disk_tiered(tmp_path_factory, model_dir):
    data_dir = tmp_path_factory.mktemp("disk-tier-cuda")
    flags = ("--num-kv-blocks", str(POOL_BLOCKS), "--host-kv-blocks", str(POOL_BLOCKS + 8), "--disk-kv-gb", "1")
    running = serve(data_dir, model_dir, *flags)
    yield running
    running.stop()
    remove_segments(data_dir)


async def test_a_prefix_gone_from_the_pool_and_the_host_comes_back_from_disk(disk_tiered, model_dir, hf_greedy):
    rng = random.Random(11)
    length = POOL_BLOCKS * BLOCK_SIZE // 3 + 5
    prompts = [[rng.randrange(10, 1000) for _ in range(length)] for _ in range(5)]
    first = [await generate_over_http(disk_tiered.base_url, p, 8) for p in prompts]
    for _ in range(100):  # the spills run in the background
        report = httpx.get(f"{disk_tiered.base_url}/admin/cache", timeout=10).json()
        if report["tiers"]["disk"]["pending_blocks"] == 0:
            break
        await asyncio.sleep(0.1)
    again = await generate_over_http(disk_tiered.base_url, prompts[0], 8)
    after = httpx.get(f"{disk_tiered.base_url}/admin/cache", timeout=10).json()
    assert after["tiers"]["disk"]["hits"] >= len(prompts[0]) // BLOCK_SIZE - 1
    assert again == first[0] == hf_greedy(model_dir, prompts[0], 8)
