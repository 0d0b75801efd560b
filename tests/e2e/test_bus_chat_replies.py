"""Tool calls on the bus, with the default model, as a plain nats-py client reads them: a chat request
(`messages`) whose reply calls a tool gets the call parsed, whole and streamed, as the HTTP chat
route gives it (tests/e2e/test_tool_calls.py); a `text` request gets its text as the model wrote it.

The bus has no `tool_choice`: a client demands a call with the grammar the frontdoor builds for
"required" (actors/lib/tool_calls/constraint.py), a structural-tag constraint. Thinking on the bus
is in tests/e2e/test_reasoning.py, whose server reads it.
"""

import json

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
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
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
DEMANDED = Constraint(
    "structural_tag", json.dumps(tool_call_constraint(hermes.FORMAT, [TOOL], "required", True).structural_tag)
)
PARAMS = SamplingParams(max_tokens=48, temperature=0.7, seed=3, constraint=DEMANDED)
ASK = [ChatMessage("user", "What's the weather like in Tokyo today?")]
CHAT = GenerateRequest(messages=ASK, chat_template=ChatTemplateArgs([TOOL]), params=PARAMS)


@pytest.fixture
async def nc(chat_server):
    connection = await chat_server.connect_nats()
    yield connection
    await connection.drain()


async def generate(nc, request: GenerateRequest) -> GenerateResult:
    reply = await nc.request("llm.generate", msgspec.msgpack.encode(request), timeout=120)
    result = msgspec.msgpack.decode(reply.data, type=GenerateChunk | GenerateResult | Error)
    assert isinstance(result, GenerateResult), result
    return result


def calls_of(result: GenerateResult) -> list[tuple[str, object]]:
    return [(c.function.name, c.function.arguments) for c in result.tool_calls]


async def test_a_demanded_call_arrives_parsed_whole_and_streamed(nc):
    whole = await generate(nc, CHAT)
    assert whole.finish_reason == "tool_calls"
    calls = calls_of(whole)
    assert calls and all(name == "get_weather" and set(a) == {"city"} for name, a in calls)
    assert all(a["city"] in CITIES for _, a in calls)
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


async def test_a_text_request_gets_the_text_as_the_model_wrote_it(nc):
    one_call = tool_call_constraint(hermes.FORMAT, [TOOL], "required", parallel=False).structural_tag
    params = msgspec.structs.replace(
        PARAMS, max_tokens=96, constraint=Constraint("structural_tag", json.dumps(one_call))
    )
    result = await generate(nc, GenerateRequest(text="Call a tool: ", params=params))
    assert result.text.startswith("<tool_call>\n{")
    assert result.tool_calls == [] and result.finish_reason == "stop"
