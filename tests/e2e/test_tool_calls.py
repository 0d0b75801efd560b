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


def arguments_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_demanded_call_is_decoded_under_its_grammar_whole_and_streamed(chat_client, choice):
    """The default model, too small to call tools on its own, calls one when it must: its arguments
    match the tool's schema (a city of three, so that the call ends well within max_tokens), whole
    and streamed alike."""
    cities = {"type": "string", "enum": ["Tokyo", "Paris", "Lima"]}
    tool = {
        **WEATHER,
        "function": {
            **WEATHER["function"],
            "parameters": {**WEATHER["function"]["parameters"], "properties": {"city": cities}},
        },
    }
    args = dict(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "What's the weather like in Tokyo today?"}],
        tools=[tool],
        tool_choice=choice,
        max_tokens=48,
        temperature=0.7,
        seed=3,
    )
    whole = chat_client.chat.completions.create(**args).choices[0]
    calls = arguments_of(whole.message)
    assert calls and all(name == "get_weather" and a == {"city": a["city"]} for name, a in calls)
    assert all(a["city"] in cities["enum"] for _, a in calls)
    assert whole.finish_reason == ("stop" if isinstance(choice, dict) else "tool_calls")
    with chat_client.chat.completions.stream(**args) as stream:
        for _event in stream:
            pass
        assert arguments_of(stream.current_completion_snapshot.choices[0].message) == calls


def test_a_tool_schema_no_grammar_can_follow_is_refused_naming_the_tools(chat_client):
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        chat_client.chat.completions.create(
            model=DEFAULT_MODEL, messages=CONVERSATION[:1], tools=[bad], tool_choice="required", max_tokens=8
        )
    assert refused.value.body["param"] == "tools"
    assert chat_client.models.list().data  # still serving


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
