"""Per-token controls through the real server, over the bus API (and once over HTTP): masks, bias,
min_tokens and penalties as a client sees them, seeded draws that do not depend on what else runs,
and bad token ids refused naming the field."""

import asyncio

import aiohttp
import msgspec
import pytest
import torch
from transformers import AutoModelForCausalLM

from gpu.config import ModelConfig
from schemas.errors import Error
from schemas.generate import GenerateChunk, GenerateRequest, GenerateResult, SamplingParams

Reply = GenerateChunk | GenerateResult | Error
PROMPT = [(37 * i) % 500 + 20 for i in range(12)]


@pytest.fixture
async def nc(server):
    connection = await server.connect_nats()
    yield connection
    await connection.drain()


@pytest.fixture(scope="module")
def model_config(server) -> ModelConfig:
    return ModelConfig.from_pretrained(server.model_dir)


async def generate(nc, prompt: list[int] = PROMPT, **params) -> GenerateResult | Error:
    request = GenerateRequest(input_ids=prompt, params=SamplingParams(**params))
    reply = await nc.request("llm.generate", msgspec.msgpack.encode(request), timeout=120)
    return msgspec.msgpack.decode(reply.data, type=Reply)


def greedy(max_tokens: int, **more) -> dict:
    return dict(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **more)


async def test_masks_and_bias_hold_at_every_token(nc):
    allowed = [40, 41, 300, 301, 302]
    for params in (greedy(16), dict(max_tokens=16, temperature=1.0, seed=7, ignore_eos=True)):
        result = await generate(nc, **params, allowed_token_ids=allowed)
        assert len(result.token_ids) == 16 and set(result.token_ids) <= set(allowed)
    plain = await generate(nc, **greedy(16))
    banned = sorted(set(plain.token_ids))
    result = await generate(nc, **greedy(16, disallowed_token_ids=banned))
    assert len(result.token_ids) == 16 and not set(result.token_ids) & set(banned)
    forced = await generate(nc, **dict(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True), logit_bias={77: 100.0})
    assert forced.token_ids == [77] * 8


async def test_min_tokens_keeps_the_end_away_until_then(nc, model_config):
    eos = model_config.eos_token_ids[0]
    pushed = dict(max_tokens=16, temperature=0.0, logit_bias={eos: 100.0})  # EOS comes at once
    early = await generate(nc, **pushed)
    assert early.finish_reason == "stop" and early.completion_tokens <= 1
    held = await generate(nc, **pushed, min_tokens=5)
    assert held.finish_reason == "stop" and held.completion_tokens >= 5
    assert eos not in held.token_ids[:5]
    stop = held.token_ids[0]  # a stop token id is an end too
    held = await generate(nc, **greedy(12, stop_token_ids=[stop], logit_bias={stop: 100.0}, min_tokens=3))
    assert stop not in held.token_ids[:3] and held.finish_reason == "stop"


async def test_penalties_change_greedy_output_as_transformers_does(nc, server):
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        reference = model.generate(
            torch.tensor([PROMPT]), max_new_tokens=20, do_sample=False, repetition_penalty=1.6, pad_token_id=0
        )[0, len(PROMPT) :].tolist()
    plain = await generate(nc, **greedy(20))
    penalized = await generate(nc, **greedy(20, repetition_penalty=1.6))
    assert penalized.token_ids == reference != plain.token_ids


async def test_seeded_draws_with_rules_do_not_depend_on_their_companions(nc):
    params = dict(
        max_tokens=20,
        temperature=0.9,
        seed=2024,
        ignore_eos=True,
        presence_penalty=0.8,
        frequency_penalty=0.3,
        logit_bias={50: 2.0},
        disallowed_token_ids=[51],
    )
    alone = await generate(nc, **params)
    companions = [generate(nc, [20 + i] * (3 + 2 * i), **greedy(10 + 3 * i, repetition_penalty=1.2)) for i in range(4)]
    together = await asyncio.gather(generate(nc, **params), *companions)
    assert together[0].token_ids == alone.token_ids and len(alone.token_ids) == 20
    assert all(isinstance(r, GenerateResult) for r in together)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (dict(logit_bias={"vocab": 1.0}), "logit_bias"),
        (dict(allowed_token_ids=[5, "vocab"]), "allowed_token_ids"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
        (dict(disallowed_token_ids=["vocab"]), "disallowed_token_ids"),
        (dict(allowed_token_ids=[5], disallowed_token_ids=[5]), "disallowed_token_ids"),
    ],
)
async def test_bad_token_ids_are_refused_naming_the_field(nc, model_config, params, field):
    vocab = model_config.vocab_size

    def resolved(value):
        if isinstance(value, dict):
            return {vocab if k == "vocab" else k: v for k, v in value.items()}
        return [vocab if v == "vocab" else v for v in value]

    reply = await generate(nc, max_tokens=4, **{k: resolved(v) for k, v in params.items()})
    assert isinstance(reply, Error)
    assert (reply.code, reply.param) == ("invalid_request", field)
    assert isinstance(await generate(nc, **greedy(2, logit_bias={vocab - 1: 1.0})), GenerateResult)


async def test_over_http_the_controls_hold_and_bad_ids_get_400_naming_the_field(server, model_config):
    vocab = model_config.vocab_size
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        url = f"{server.base_url}/v1/completions"
        async with http.post(url, json={**body, "allowed_token_ids": [40, 41, 300], "return_token_ids": True}) as reply:
            assert reply.status == 200, await reply.text()
            choice = (await reply.json())["choices"][0]
        assert len(choice["token_ids"]) == 12 and set(choice["token_ids"]) <= {40, 41, 300}
        for field, value in (("logit_bias", {str(vocab): 5}), ("disallowed_token_ids", [vocab + 3])):
            async with http.post(url, json={**body, field: value}) as reply:
                assert reply.status == 400
                assert (await reply.json())["error"]["param"] == field
