"""Thinking and the chat template's inputs through the whole system, with the `openai` SDK: a model
whose template renders tools itself (Qwen3's way) gets them as `tools=`, `chat_template_kwargs`
reach its template, and `--reasoning-parser deepseek-r1` moves the thinking into
`reasoning_content`, the same whole and streamed, over HTTP and on the bus.

The model is a tiny random one with such a template: what it writes does not matter here, only
where the server puts it. Its vocabulary has no `<think>` token, so deepseek-r1 reads every reply
as thinking that was never closed.
"""

import json
import shutil

import msgspec
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from ops.bus_client import stream_generate
from ops.local_server import start_server
from schemas.errors import Error
from schemas.generate import ChatMessage, Constraint, GenerateChunk, GenerateRequest, GenerateResult, SamplingParams

# Qwen3's shape in a few lines: tools in the system turn, calls as <tool_call> blocks, tool results as
# user turns, and an empty thinking block when enable_thinking is false.
TEMPLATE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages if message.role != 'system' %}
{%- if message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{%- endif %}"""
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLED = [
    *ASK,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees"},
]
SAMPLED = dict(model="thinker", max_tokens=12, temperature=0.9, seed=3, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def model_dir(build_tiny_model, tmp_path_factory):
    target = tmp_path_factory.mktemp("thinker") / "thinker"
    shutil.copytree(build_tiny_model("qwen3"), target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(config | {"chat_template": TEMPLATE}))
    return target


@pytest.fixture(scope="module")
def thinker(model_dir, tmp_path_factory):
    server = start_server(
        tmp_path_factory.mktemp("thinker-data"),
        "--num-kv-blocks",
        "128",
        "--reasoning-parser",
        "deepseek-r1",
        "--served-model-name",
        "thinker",
        model=str(model_dir),
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(thinker):
    return OpenAI(base_url=f"{thinker.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_template_that_renders_tools_gets_them_and_its_variables(client, model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    conversation = json.loads(json.dumps(CALLED))
    conversation[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}  # templates read them decoded
    for kwargs in ({}, {"enable_thinking": False}):
        reply = client.chat.completions.create(
            model="thinker",
            max_tokens=1,
            messages=CALLED,
            tools=[WEATHER],
            extra_body={"return_token_ids": True, "chat_template_kwargs": kwargs},
        )
        expected = tokenizer.apply_chat_template(
            conversation, tools=[WEATHER], add_generation_prompt=True, return_dict=False, **kwargs
        )
        assert reply.prompt_token_ids == expected
        rendered = tokenizer.decode(expected)
        assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in rendered
        assert rendered.endswith("<think>\n\n</think>\n\n") == bool(kwargs)


def test_thinking_goes_to_reasoning_content_whole_and_streamed(client):
    whole = client.chat.completions.create(**SAMPLED, messages=ASK).choices[0].message
    assert whole.reasoning_content and whole.content is None  # never closed: all thinking
    chunks = list(client.chat.completions.create(**SAMPLED, messages=ASK, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.reasoning_content or "" for d in deltas if hasattr(d, "reasoning_content")) == (
        whole.reasoning_content
    )
    assert "".join(d.content or "" for d in deltas) == ""


def test_reasoning_fields_of_vllm_and_sglang(client):
    whole = client.chat.completions.create(**SAMPLED, messages=ASK).choices[0].message
    fields = SAMPLED["extra_body"]
    kept = client.chat.completions.create(
        **SAMPLED | {"extra_body": fields | {"separate_reasoning": False}}, messages=ASK
    )
    assert kept.choices[0].message.content == whole.reasoning_content  # SGLang's: the text as it came
    hidden = client.chat.completions.create(
        **SAMPLED | {"extra_body": fields | {"include_reasoning": False}}, messages=ASK
    )
    assert "reasoning_content" not in hidden.choices[0].message.model_dump(exclude_unset=True)  # vLLM's


async def test_thinking_is_separated_on_the_bus_whole_and_streamed(thinker):
    """A reply that thinks, then answers: written under a regex, since the model's own words are
    random. A text request's reply is the text as it came."""
    written = SamplingParams(max_tokens=64, seed=3, constraint=Constraint("regex", r"I think so\.</think>\n\nParis"))
    request = GenerateRequest(messages=[ChatMessage("user", "Where?")], params=written)
    nc = await thinker.connect_nats()
    try:
        reply = await nc.request("llm.generate", msgspec.msgpack.encode(request), timeout=120)
        whole = msgspec.msgpack.decode(reply.data, type=GenerateChunk | GenerateResult | Error)
        assert isinstance(whole, GenerateResult), whole
        assert (whole.reasoning_content, whole.text, whole.finish_reason) == ("I think so.", "Paris", "stop")
        replies = [r async for r in stream_generate(nc, msgspec.structs.replace(request, stream=True))]
        chunks, streamed = replies[:-1], replies[-1]
        assert "".join(c.reasoning_content for c in chunks) == streamed.reasoning_content == "I think so."
        assert "".join(c.text for c in chunks) == streamed.text == "Paris"
        raw = msgspec.structs.replace(request, messages=None, text="Where?")
        reply = await nc.request("llm.generate", msgspec.msgpack.encode(raw), timeout=120)
        assert msgspec.msgpack.decode(reply.data, type=GenerateResult).text == "I think so.</think>\n\nParis"
    finally:
        await nc.drain()
