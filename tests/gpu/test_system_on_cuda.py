"""The whole actor system with its executor on CUDA, where it launches steps on its event loop and
polls for their end there (on the CPU a worker thread runs them). In float32 our CUDA forward
decodes as transformers does, so greedy output over HTTP must be transformers' token for token:
one request alone, and requests that join and leave a running batch.
"""

import asyncio

import pytest

from ops.local_server import start_server
from tests.devices import needs_cuda
from tests.over_http import generate_over_http, random_prompts

pytestmark = [
    pytest.mark.gpu,
    needs_cuda,
]


@pytest.fixture(scope="module")
def model_dir(build_tiny_model):
    return build_tiny_model("llama")


@pytest.fixture(scope="module")
def cuda_server(tmp_path_factory, model_dir):
    running = start_server(
        tmp_path_factory.mktemp("cuda-system"),
        "--device",
        "cuda",
        "--dtype",
        "float32",
        "--num-kv-blocks",
        "256",
        model=str(model_dir),
    )
    yield running
    running.stop()


def prompts(count: int, seed: int) -> list[list[int]]:
    """Within the tiny model's vocabulary of 1024 ids."""
    return random_prompts(count, seed, high=1000)


async def test_one_request_matches_transformers(cuda_server, model_dir, hf_greedy):
    prompt = prompts(1, seed=1)[0]
    assert await generate_over_http(cuda_server.base_url, prompt, 24) == hf_greedy(model_dir, prompt, 24)


async def test_requests_joining_a_running_batch_match_transformers(cuda_server, model_dir, hf_greedy):
    batch = prompts(8, seed=7)
    lengths = [40 + 8 * i for i in range(8)]
    # A step of this model takes about a millisecond: 3 ms apart, each request joins the others mid-run.
    outputs = await asyncio.gather(
        *(
            generate_over_http(cuda_server.base_url, p, n, delay_s=0.003 * i)
            for i, (p, n) in enumerate(zip(batch, lengths))
        )
    )
    for prompt, n, output in zip(batch, lengths, outputs):
        assert output == hf_greedy(model_dir, prompt, n)
