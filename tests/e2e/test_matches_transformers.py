"""Greedy output through the whole actor system is token-for-token what transformers generates."""

import asyncio
import random

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM


@pytest.fixture(scope="module")
def reference(server):
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None  # compare whole lengths; EOS handling is tested elsewhere

    def generate(prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=0)
        return out[0, len(prompt_ids):].tolist()

    return generate


def prompts(count: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 1500) for _ in range(rng.randrange(3, 120))] for _ in range(count)]


async def generate_over_http(server, prompt_ids: list[int], max_tokens: int, delay_s: float) -> list[int]:
    await asyncio.sleep(delay_s)
    async with httpx.AsyncClient(timeout=120) as http:
        body = {"input_ids": prompt_ids, "sampling_params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
        response = await http.post(f"{server.base_url}/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()["token_ids"]


async def test_one_request_matches(server, reference):
    prompt = prompts(1, seed=1)[0]
    assert await generate_over_http(server, prompt, 24, 0) == reference(prompt, 24)


async def test_eight_concurrent_requests_started_at_different_times_match(server, reference):
    batch = prompts(8)
    lengths = [8 + 5 * i for i in range(8)]
    outputs = await asyncio.gather(*(
        generate_over_http(server, p, n, delay_s=0.05 * i) for i, (p, n) in enumerate(zip(batch, lengths))
    ))
    for prompt, n, output in zip(batch, lengths, outputs):
        assert output == reference(prompt, n)
