"""The whole actor system with its executor on CUDA, where it launches steps on its event loop and
polls for their end there (on the CPU a worker thread runs them). In float32 our CUDA forward
decodes as transformers does, so greedy output over HTTP must be transformers' token for token:
one request alone, and requests that join and leave a running batch.
"""

import asyncio
import random

import aiohttp
import pytest
import torch

from ops.local_server import start_server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def model_dir(build_tiny_model):
    return build_tiny_model("llama")


@pytest.fixture(scope="module")
def cuda_server(tmp_path_factory, model_dir):
    running = start_server(
        tmp_path_factory.mktemp("cuda-system"), "--model", str(model_dir), "--device", "cuda", "--dtype", "float32",
        "--num-kv-blocks", "256",
    )
    yield running
    running.stop()


def prompts(count: int, seed: int) -> list[list[int]]:
    """Random prompts within the tiny model's vocabulary of 1024 ids."""
    rng = random.Random(seed)
    return [[rng.randrange(10, 1000) for _ in range(rng.randrange(3, 120))] for _ in range(count)]


async def generate_over_http(base_url: str, prompt_ids: list[int], max_tokens: int, delay_s: float = 0) -> list[int]:
    await asyncio.sleep(delay_s)
    body = {"input_ids": prompt_ids, "sampling_params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        async with http.post(f"{base_url}/generate", json=body) as response:
            assert response.status == 200, await response.text()
            return (await response.json())["token_ids"]


async def test_one_request_matches_transformers(cuda_server, model_dir, hf_greedy):
    prompt = prompts(1, seed=1)[0]
    assert await generate_over_http(cuda_server.base_url, prompt, 24) == hf_greedy(model_dir, prompt, 24)


async def test_requests_joining_a_running_batch_match_transformers(cuda_server, model_dir, hf_greedy):
    batch = prompts(8, seed=7)
    lengths = [40 + 8 * i for i in range(8)]
    # A step of this model takes about a millisecond: 3 ms apart, each request joins the others mid-run.
    outputs = await asyncio.gather(*(
        generate_over_http(cuda_server.base_url, p, n, delay_s=0.003 * i) for i, (p, n) in enumerate(zip(batch, lengths))
    ))
    for prompt, n, output in zip(batch, lengths, outputs):
        assert output == hf_greedy(model_dir, prompt, n)
