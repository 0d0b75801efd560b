"""Messages cross the bus whole, so its payload limit (`--bus-max-payload-bytes`) bounds a prompt: a
longer one gets a clear 400 at once, as text or as token ids, and the server goes on serving. A
round of the scheduler's commands over the limit goes to the executor in parts, and the requests
in it get the tokens of a server whose limit is NATS's default; prompt logprobs over the limit
reach the client in parts, whole."""

import asyncio
import random

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from ops.local_server import start_server

MAX_PAYLOAD = 8192  # bytes
BLOCKS = 256  # of 16 tokens
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def small_bus_server(tmp_path_factory):
    running = start_server(
        tmp_path_factory.mktemp("small-bus"),
        "--num-kv-blocks",
        str(BLOCKS),
        "--bus-max-payload-bytes",
        str(MAX_PAYLOAD),
        "--max-prefill-tokens",
        "4096",
    )
    yield running
    running.stop()


def body(prompt_ids: list[int], max_new_tokens: int = 6) -> dict:
    return {
        "input_ids": prompt_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
    }


def prompt(tokens: int, seed: int) -> list[int]:
    """Token ids from 256 up: 3 bytes each on the bus."""
    rng = random.Random(seed)
    return [rng.randrange(256, 2048) for _ in range(tokens)]


async def test_prompts_over_the_limit_get_400_at_once(small_bus_server):
    rng = random.Random(0)
    text = " ".join(str(rng.randrange(10**6)) for _ in range(1000))  # 6.9 KB of text, 8.5 KB of token ids
    async with httpx.AsyncClient(base_url=small_bus_server.base_url, timeout=5) as http:
        # Token ids: the Submit to the scheduler is too large. Text: the tokenizer's answer is.
        ids = await http.post("/generate", json=body(prompt(3000, seed=1)))
        words = await http.post("/v1/completions", json={"model": "demo", "prompt": text, "max_tokens": 4})
        # Computed, unlike those: on a loaded machine it may take longer than their refusals may.
        served = await http.post("/generate", json=body(prompt(50, seed=2)), timeout=60)
    for refused in (ids, words):
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["type"] == "invalid_request_error" and "max_payload" in error["message"], error
    assert served.status_code == 200, served.text


async def test_a_round_over_the_limit_reaches_the_executor_in_parts(small_bus_server, server):
    """Two 1,700-token prompts (5 KB each) wait for the blocks of a running 3,000-token one and are
    started together when it ends: their commands, about 10 KB, go in parts."""
    holder = {
        "input_ids": [i % 100 for i in range(3000)],  # one byte a token: its Submit fits
        "sampling_params": {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    waiting = [prompt(1700, seed=3), prompt(1700, seed=4)]
    async with httpx.AsyncClient(base_url=small_bus_server.base_url, timeout=60) as http:
        async with http.stream("POST", "/generate", json=holder) as running:
            lines = running.aiter_lines()
            while not (await anext(lines)).startswith("data: {"):  # it holds its blocks now
                pass
            answers = await asyncio.gather(*(http.post("/generate", json=body(p)) for p in waiting))
            async for _ in lines:
                pass
    assert small_bus_server.find("commands_split"), "the waiting prompts were not started in one round"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:  # NATS's default limit
        references = [(await http.post("/generate", json=body(p))).json()["output_ids"] for p in waiting]
    assert [a.json()["output_ids"] for a in answers] == references and all(len(r) == 6 for r in references)


def test_prompt_logprobs_larger_than_a_bus_message_arrive_whole(small_bus_server):
    """A chunk's prompt logprobs with 20 top and 64 asked ids each outgrow the bus many times over:
    the executor publishes its step in parts, the tokenizer its outputs, and every position reaches
    the HTTP client in order, as transformers has it."""
    prompt_ids = [10 + (i * 37) % 1400 for i in range(300)]
    body = {
        "input_ids": prompt_ids,
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 20,
        "token_ids_logprob": list(range(64)),
    }
    response = httpx.post(f"{small_bus_server.base_url}/generate", json=body, timeout=120)
    served = httpx.post(f"{small_bus_server.base_url}/generate", json={"text": "still there?"}, timeout=60)
    assert response.status_code == 200, response.text
    assert served.status_code == 200  # nothing crashed
    meta = response.json()["meta_info"]
    inputs, tops, asked = meta["input_token_logprobs"], meta["input_top_logprobs"], meta["input_token_ids_logprobs"]
    assert [entry[1] for entry in inputs] == prompt_ids and inputs[0][0] is None
    model = AutoModelForCausalLM.from_pretrained(small_bus_server.model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([prompt_ids])).logits[0].float(), dim=-1)
    for position in range(1, len(prompt_ids)):
        row = reference[position - 1]
        assert abs(inputs[position][0] - row[prompt_ids[position]].item()) < TOLERANCE, position
        # The reference's top 20, but for the order of logprobs within rounding of each other (the
        # server's batch computes them in another order than one forward pass: near-ties may swap).
        values = [entry[0] for entry in tops[position]]
        assert values == sorted(values, reverse=True), position
        assert max(abs(a - b) for a, b in zip(values, row.topk(20).values.tolist())) < TOLERANCE, position
        assert all(abs(row[entry[1]].item() - entry[0]) < TOLERANCE for entry in tops[position]), position
        assert len(asked[position]) == 64
