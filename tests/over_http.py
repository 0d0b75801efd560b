"""Greedy generation through a running deployment's native `/generate`, for the tests that compare
the whole system with transformers."""

import asyncio
import random

import aiohttp


def random_prompts(count: int, seed: int, high: int) -> list[list[int]]:
    """`count` prompts of 3 to 119 token ids drawn from [10, high)."""
    rng = random.Random(seed)
    return [[rng.randrange(10, high) for _ in range(rng.randrange(3, 120))] for _ in range(count)]


async def generate_over_http(base_url: str, prompt_ids: list[int], max_tokens: int, delay_s: float = 0) -> list[int]:
    """The token ids of a greedy, EOS-ignoring completion of `prompt_ids`, sent after `delay_s`."""
    await asyncio.sleep(delay_s)
    body = {
        "input_ids": prompt_ids,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        async with http.post(f"{base_url}/generate", json=body) as response:
            assert response.status == 200, await response.text()
            return (await response.json())["output_ids"]
