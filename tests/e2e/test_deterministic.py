"""`--deterministic` through the whole server: `/server_info` says so (SGLang's
`enable_deterministic_inference`), and a request's tokens and logprobs are the same alone, among
others, and as the prompt logprobs of its finished sequence sent back (teacher forcing), its prompt
cut into chunks by a small prefill budget. On the CPU the default operators are row-invariant
already, so this checks the flag's way through the actors to the executor's runner; the GPU's bits
are tests/gpu/test_determinism_cuda.py's."""

import asyncio

import httpx
import msgspec
import pytest

from ops.local_server import start_server
from schemas.errors import Error
from schemas.generate import GenerateRequest, GenerateResult, SamplingParams
from tests.over_http import random_prompts


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The executor on the plain CPU path, as a deployment runs it: not in Triton's interpreter,
    # which the test session turns on for the kernel tests.
    with pytest.MonkeyPatch.context() as env:
        env.delenv("TRITON_INTERPRET", raising=False)
        running = start_server(
            tmp_path_factory.mktemp("deterministic"),
            "--deterministic",
            "--num-kv-blocks",
            "256",
            "--max-prefill-tokens",
            "32",
        )
    yield running
    running.stop()


async def generate(nc, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
    request = msgspec.msgpack.encode(GenerateRequest(input_ids=prompt_ids, params=params))
    reply = msgspec.msgpack.decode(
        (await nc.request("llm.generate", request, timeout=120)).data, type=GenerateResult | Error
    )
    assert isinstance(reply, GenerateResult), reply
    return reply


async def test_a_rollout_is_the_same_alone_among_others_and_sent_back(server):
    assert httpx.get(f"{server.base_url}/server_info").json()["enable_deterministic_inference"] is True
    nc = await server.connect_nats()
    prompt, *others = random_prompts(8, seed=4, high=1500)
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5, ignore_eos=True, logprobs=True, top_logprobs=3)
    alone = await generate(nc, prompt, params)
    among = await asyncio.gather(*(generate(nc, p, params) for p in [*others[:4], prompt, *others[4:]]))
    assert (among[4].token_ids, among[4].logprobs) == (alone.token_ids, alone.logprobs)
    scoring = SamplingParams(max_tokens=0, top_logprobs=3, prompt_logprobs_from=len(prompt))
    forced = await generate(nc, prompt + alone.token_ids, scoring)
    assert forced.prompt_logprobs.logprobs == alone.logprobs.logprobs
    assert forced.prompt_logprobs.top_ids == alone.logprobs.top_ids
    await nc.drain()
