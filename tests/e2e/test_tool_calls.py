"""Tools through the whole system with the default model and the `openai` SDK, unchanged: the
model's template renders no tools, so the tokenizer describes them in Hermes' format; a
conversation with tool results continues; a streamed reply, gathered by the SDK's own stream helper,
is the reply whole; bad tool input is a 400 naming the field, and the server keeps serving.

Without the grammar of a demanded call (a separate part, not connected here) this 135M model does
not write `<tool_call>` blocks, so the parsing of real calls is tested on the parsers themselves
(tests/actors/test_tool_call_parsers.py) and on replies built from text (tests/frontdoor/test_chat_tools.py).
"""

import json

import openai
import pytest
from transformers import AutoTokenizer

from actors.tokenizer.tool_prompt import hermes_conversation
from kernel.model_source import DEFAULT_MODEL

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees and sunny"},
]


@pytest.fixture(scope="module")
def tokenizer(chat_server):
    return AutoTokenizer.from_pretrained(chat_server.model_dir)


def test_the_tools_and_results_reach_a_template_that_renders_none(chat_client, tokenizer):
    reply = chat_client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=CONVERSATION,
        tools=[WEATHER],
        max_tokens=1,
        extra_body={"return_token_ids": True},
    )
    conversation = [dict(m, content=m["content"] or "") for m in CONVERSATION]
    conversation[1]["tool_calls"] = [{**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    expected = tokenizer.apply_chat_template(
        hermes_conversation(conversation, [WEATHER]), add_generation_prompt=True, return_dict=False
    )
    assert reply.prompt_token_ids == expected
    rendered = tokenizer.decode(expected)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in rendered
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert "<|im_start|>user\n<tool_response>\n22 degrees and sunny\n</tool_response><|im_end|>" in rendered


def test_a_conversation_with_tool_results_continues(chat_client):
    reply = chat_client.chat.completions.create(
        model=DEFAULT_MODEL, messages=CONVERSATION, tools=[WEATHER], max_tokens=16, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    assert reply.usage.completion_tokens > 0


def test_a_streamed_reply_is_the_reply_whole(chat_client):
    args = dict(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "What's the weather like in Tokyo today?"}],
        tools=[WEATHER],
        tool_choice="required",  # read as auto is, but for JSON at the start, which counts as calls
        max_tokens=24,
        temperature=0.8,
        seed=7,
    )
    whole = chat_client.chat.completions.create(**args).choices[0]
    with chat_client.chat.completions.stream(**args) as stream:  # the SDK's helper gathers the deltas
        for _event in stream:
            pass
        streamed = stream.current_completion_snapshot.choices[0]
    assert streamed.finish_reason == whole.finish_reason
    assert streamed.message.content == whole.message.content
    calls = [
        [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls or []]
        for m in (streamed.message, whole.message)
    ]
    assert calls[0] == calls[1]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"messages": [*CONVERSATION[:2], {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "messages[2].tool_call_id",
        ),
        (
            {"extra_body": {"chat_template_kwargs": {"add_generation_prompt": False}}},
            "chat_template_kwargs.add_generation_prompt",
        ),
    ],
)
def test_bad_tool_input_names_the_field_and_the_server_keeps_serving(chat_client, fields, param):
    args = dict(model=DEFAULT_MODEL, messages=CONVERSATION[:1], max_tokens=2) | fields
    with pytest.raises(openai.BadRequestError) as refused:
        chat_client.chat.completions.create(**args)
    assert refused.value.body["param"] == param
    good = dict(model=DEFAULT_MODEL, messages=CONVERSATION, tools=[WEATHER], max_tokens=2)
    assert chat_client.chat.completions.create(**good).choices
