"""The OpenAI-compatible API through the whole stack, with the official SDK."""

import httpx
import openai
import pytest
from transformers import AutoTokenizer


@pytest.fixture(scope="module")
def tokenizer(server):
    return AutoTokenizer.from_pretrained(server.model_dir)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["demo"]


def test_chat_completion_counts_usage(client, tokenizer):
    messages = [{"role": "user", "content": "Tell me a story."}]
    reply = client.chat.completions.create(model="demo", messages=messages, max_tokens=12, temperature=0)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert reply.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.choices[0].message.role == "assistant"


def test_completion_stops_at_max_tokens(client, tokenizer):
    reply = client.completions.create(
        model="demo", prompt="The river", max_tokens=9, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 9
    assert reply.usage.prompt_tokens == len(tokenizer.encode("The river"))


def test_streamed_chat_equals_whole_reply(client):
    args = dict(model="demo", messages=[{"role": "user", "content": "Hi there"}], max_tokens=20, temperature=0)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stream_ends_with_done(server):
    body = {"model": "demo", "prompt": "A cat", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_seed_makes_sampling_reproducible(client):
    args = dict(
        model="demo",
        prompt="Once upon",
        max_tokens=16,
        temperature=1.0,
        top_p=0.9,
        extra_body={"ignore_eos": True, "top_k": 50},
    )
    first = client.completions.create(**args, seed=1234).choices[0].text
    again = client.completions.create(**args, seed=1234).choices[0].text
    other = client.completions.create(**args, seed=4321).choices[0].text
    assert first == again
    assert first != other


def test_min_p_one_keeps_only_the_most_likely_token(client):
    args = dict(model="demo", prompt="Once upon", max_tokens=16, seed=7)
    greedy = client.completions.create(**args, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    hot = client.completions.create(**args, temperature=2.0, extra_body={"ignore_eos": True}).choices[0].text
    pinned = client.completions.create(**args, temperature=2.0, extra_body={"ignore_eos": True, "min_p": 1.0})
    assert hot != greedy
    assert pinned.choices[0].text == greedy
    chat = dict(model="demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, seed=7)
    pinned_chat = client.chat.completions.create(**chat, temperature=2.0, extra_body={"min_p": 1.0})
    greedy_chat = client.chat.completions.create(**chat, temperature=0)
    assert pinned_chat.choices[0].message.content == greedy_chat.choices[0].message.content


def test_min_p_out_of_range_is_a_400_and_the_server_keeps_serving(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="demo", prompt="x", max_tokens=2, extra_body={"min_p": 1.5})
    assert refused.value.body["param"] == "min_p"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "x"}], extra_body={"min_p": -0.5}
        )
    reply = client.completions.create(
        model="demo", prompt="x", max_tokens=2, temperature=0.8, extra_body={"min_p": 0.1}
    )
    assert reply.usage.completion_tokens > 0


def test_stop_string_truncates_and_finishes(client):
    free = (
        client.completions.create(
            model="demo", prompt="Hello", max_tokens=30, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    stop = free[5:8]
    assert len(stop) == 3 and stop.strip()
    reply = client.completions.create(
        model="demo", prompt="Hello", max_tokens=30, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].text == free[: free.index(stop)]
    assert reply.usage.completion_tokens < 30


def test_stop_token_id_finishes(server):
    generated = httpx.post(
        f"{server.base_url}/generate",
        json={"text": "Hello", "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}},
        timeout=60,
    ).json()
    stop_id = generated["output_ids"][4]
    first = generated["output_ids"].index(stop_id)
    stopped = httpx.post(
        f"{server.base_url}/generate",
        json={
            "text": "Hello",
            "sampling_params": {
                "max_new_tokens": 12,
                "temperature": 0,
                "ignore_eos": True,
                "stop_token_ids": [stop_id],
            },
        },
        timeout=60,
    ).json()
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert stopped["output_ids"] == generated["output_ids"][: first + 1]


def test_native_generate_takes_input_ids(server, tokenizer):
    ids = tokenizer.encode("Some words")
    by_ids = httpx.post(
        f"{server.base_url}/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
        timeout=60,
    ).json()
    by_text = httpx.post(
        f"{server.base_url}/generate",
        json={"text": "Some words", "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
        timeout=60,
    ).json()
    assert by_ids["output_ids"] == by_text["output_ids"]
    assert by_ids["meta_info"]["prompt_tokens"] == len(ids)
    assert tokenizer.decode(by_ids["output_ids"], skip_special_tokens=True) == by_ids["text"]


def test_health(server):
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
