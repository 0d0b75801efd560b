"""Tool calls on the bus, with the default model, as a plain nats-py client sends and reads them: a
chat request (`messages`) takes `tool_choice` and `parallel_tool_calls` in its `chat_template`, as
the HTTP chat route takes them (tests/e2e/test_tool_calls.py): "required" or a named function gets a
call decoded under its tool's schema, parsed whole and streamed; "none" offers no tools and reads no
call; a name among no tools is an `Error` naming the field. A `text` request gets its text as the
model wrote it. Thinking on the bus is in tests/e2e/test_reasoning.py, whose server reads it.
"""

import json
from typing import Literal

import msgspec
import pytest

from actors.lib.tool_calls import hermes
from actors.lib.tool_calls.constraint import tool_call_constraint
from ops.bus_client import stream_generate
from schemas.errors import Error
from schemas.generate import (
    ChatMessage,
    ChatTemplateArgs,
    Constraint,
    FunctionChoice,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    NamedToolChoice,
    SamplingParams,
)

CITIES = ["Tokyo", "Paris", "Lima"]  # few, so that the call ends well within max_tokens
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": CITIES}},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "JST"]}}},
    },
}
PARAMS = SamplingParams(max_tokens=48, temperature=0.7, seed=3)
ASK = [ChatMessage("user", "What's the weather like in Tokyo today?")]
CHAT = GenerateRequest(messages=ASK, chat_template=ChatTemplateArgs([TOOL], tool_choice="required"), params=PARAMS)


class WeatherArguments(msgspec.Struct, forbid_unknown_fields=True):
    """TOOL's parameters schema, as msgspec checks it."""

    city: Literal["Tokyo", "Paris", "Lima"]


@pytest.fixture
async def nc(chat_server):
    connection = await chat_server.connect_nats()
    yield connection
    await connection.drain()


async def ask(nc, request: GenerateRequest) -> GenerateResult | Error:
    reply = await nc.request("llm.generate", msgspec.msgpack.encode(request), timeout=120)
    return msgspec.msgpack.decode(reply.data, type=GenerateChunk | GenerateResult | Error)


async def generate(nc, request: GenerateRequest) -> GenerateResult:
    result = await ask(nc, request)
    assert isinstance(result, GenerateResult), result
    return result


def calls_of(result: GenerateResult) -> list[tuple[str, object]]:
    return [(c.function.name, c.function.arguments) for c in result.tool_calls]


async def test_a_required_call_arrives_parsed_whole_and_streamed(nc):
    whole = await generate(nc, CHAT)
    assert whole.finish_reason == "tool_calls"
    calls = calls_of(whole)
    assert calls and all(name == "get_weather" for name, _ in calls)
    for _, arguments in calls:
        msgspec.convert(arguments, WeatherArguments)  # valid under the tool's schema
    assert all(c.id.startswith("call_") for c in whole.tool_calls)
    assert whole.text == "" and whole.token_ids  # the markup is not content; the tokens are all there

    replies = [r async for r in stream_generate(nc, msgspec.structs.replace(CHAT, stream=True))]
    chunks, streamed = replies[:-1], replies[-1]
    assert isinstance(streamed, GenerateResult) and streamed.token_ids == whole.token_ids  # same seed
    assert (streamed.finish_reason, streamed.text, calls_of(streamed)) == ("tool_calls", "", calls)
    assert "".join(c.text for c in chunks) == ""
    pieces = [d for c in chunks for d in c.tool_calls]
    named = [d for d in pieces if d.name is not None]
    assert [(d.id, d.name) for d in named] == [(c.id, c.function.name) for c in streamed.tool_calls]
    arguments = ["".join(d.arguments for d in pieces if d.index == i) for i in range(len(named))]
    assert [json.loads(a) for a in arguments] == [a for _, a in calls]


async def test_a_named_function_is_the_one_called_and_none_calls_nothing(nc):
    asked = ChatTemplateArgs([TOOL, CLOCK], tool_choice=NamedToolChoice("function", FunctionChoice("get_time")))
    named = await generate(nc, msgspec.structs.replace(CHAT, chat_template=asked))
    assert [name for name, _ in calls_of(named)] == ["get_time"]  # one call: a named choice allows no more
    assert named.finish_reason == "stop"  # as OpenAI ends a named function's call

    unoffered = msgspec.structs.replace(asked, tool_choice="none")
    short = msgspec.structs.replace(PARAMS, max_tokens=16)
    none = await generate(nc, msgspec.structs.replace(CHAT, chat_template=unoffered, params=short))
    assert none.tool_calls == [] and none.finish_reason in ("stop", "length")
    assert none.text and none.token_ids


@pytest.mark.parametrize(
    "tool_choice",
    [{"type": "function", "function": {"name": "launch_rocket"}}, "sometimes", "required"],
)
async def test_a_choice_of_no_such_tool_is_an_error_naming_the_field(nc, tool_choice):
    """An unknown name, an unknown choice, and a demand with no tools offered."""
    tools = [TOOL] if tool_choice != "required" else []
    sent = msgspec.to_builtins(CHAT) | {"chat_template": {"tools": tools, "tool_choice": tool_choice}}
    reply = await nc.request("llm.generate", msgspec.msgpack.encode(sent), timeout=30)
    error = msgspec.msgpack.decode(reply.data, type=GenerateChunk | GenerateResult | Error)
    assert isinstance(error, Error) and error.param == "chat_template.tool_choice", error


async def test_a_text_request_gets_the_text_as_the_model_wrote_it(nc):
    one_call = tool_call_constraint(hermes.FORMAT, [TOOL], "required", parallel=False).structural_tag
    params = msgspec.structs.replace(
        PARAMS, max_tokens=96, constraint=Constraint("structural_tag", json.dumps(one_call))
    )
    result = await generate(nc, GenerateRequest(text="Call a tool: ", params=params))
    assert result.text.startswith("<tool_call>\n{")
    assert result.tool_calls == [] and result.finish_reason == "stop"
