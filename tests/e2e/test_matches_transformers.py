"""Greedy output through the whole actor system is token-for-token what transformers generates."""

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.over_http import generate_over_http, random_prompts


@pytest.fixture(scope="module")
def reference(server):
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None  # compare whole lengths; EOS handling is tested elsewhere

    def generate(prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0
            )
        return out[0, len(prompt_ids) :].tolist()

    return generate


def prompts(count: int, seed: int = 7) -> list[list[int]]:
    return random_prompts(count, seed, high=1500)


async def test_one_request_matches(server, reference):
    prompt = prompts(1, seed=1)[0]
    assert await generate_over_http(server.base_url, prompt, 24) == reference(prompt, 24)


async def test_eight_concurrent_requests_started_at_different_times_match(server, reference):
    batch = prompts(8)
    lengths = [8 + 5 * i for i in range(8)]
    outputs = await asyncio.gather(
        *(generate_over_http(server.base_url, p, n, delay_s=0.05 * i) for i, (p, n) in enumerate(zip(batch, lengths)))
    )
    for prompt, n, output in zip(batch, lengths, outputs):
        assert output == reference(prompt, n)
