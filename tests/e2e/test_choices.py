"""`n` choices of one prompt: over HTTP (completions and chat, whole and streamed) and the bus.
Each choice draws its own tokens; with a seed the whole set is reproducible, and a choice is what
a single request with that choice's seed gives."""

import msgspec

from kernel.randomness import choice_seed
from ops.bus_client import stream_generate
from schemas.generate import GenerateChunk, GenerateRequest, GenerateResult, SamplingParams

ARGS = dict(model="demo", max_tokens=10, temperature=0.9, seed=42, extra_body={"ignore_eos": True})


def test_completion_choices_differ_and_repeat_with_the_seed(client):
    first = client.completions.create(prompt="Once upon a time", n=4, **ARGS)
    again = client.completions.create(prompt="Once upon a time", n=4, **ARGS)
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert len(set(texts)) == 4
    assert [c.text for c in again.choices] == texts
    assert first.usage.completion_tokens == 40
    single = client.completions.create(prompt="Once upon a time", n=1, **ARGS)
    assert single.choices[0].text == texts[0]  # choice 0 keeps the request's seed
    third = client.completions.create(prompt="Once upon a time", **(ARGS | {"seed": choice_seed(42, 2)}))
    assert third.choices[0].text == texts[2]


def test_streamed_chat_choices_equal_the_whole_reply(client):
    args = ARGS | dict(messages=[{"role": "user", "content": "Tell me more"}], n=3)
    whole = client.chat.completions.create(**args)
    streamed = ["", "", ""]
    finishes = [None, None, None]
    for chunk in client.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert streamed == [c.message.content for c in whole.choices]
    assert finishes == ["length"] * 3


async def test_bus_choices_arrive_numbered_then_a_result_each(server):
    nc = await server.connect_nats()
    params = SamplingParams(max_tokens=8, temperature=0.9, seed=7, ignore_eos=True)
    replies = [r async for r in stream_generate(nc, GenerateRequest(text="Hello", params=params, n=3))]
    await nc.drain()
    chunks = [r for r in replies if isinstance(r, GenerateChunk)]
    results = [r for r in replies if isinstance(r, GenerateResult)]
    assert [c.sequence for c in chunks] == list(range(len(chunks)))
    assert [r.index for r in results] == [0, 1, 2]
    for result in results:
        assert [t for c in chunks if c.index == result.index for t in c.token_ids] == result.token_ids
        assert result.completion_tokens == 8
    assert len({tuple(r.token_ids) for r in results}) == 3
    assert msgspec.structs.asdict(results[0])["prompt_tokens"] > 0
