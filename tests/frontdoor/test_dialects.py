"""OpenAI's Responses API and Anthropic's Messages translated onto the chat path, and replies read
back into their shapes: the request's conversation, tools and fields as the chat path takes them;
bad input refused naming the client's own field; a reply with thinking and a tool call, whole and
streamed, checked against the `openai` and `anthropic` SDKs' own types (the stream gathered by the
openai SDK's own stream reader)."""

import json

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai import omit
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from actors.frontdoor.anthropic_messages import parse_messages_request
from actors.frontdoor.anthropic_output import AnthropicDialect
from actors.frontdoor.dialect_serving import Ending
from actors.frontdoor.responses_api import parse_responses_request
from actors.frontdoor.responses_output import ResponsesDialect
from actors.lib.chat_format import ChatFormat
from actors.lib.chat_reply import ReplyReader
from schemas.errors import Error
from schemas.generate import ChatMessage, ChatToolCall, ToolCallFunction

MODEL = "m"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
THINKING = ChatFormat(reasoning_parser="qwen3")
REPLY = '<think>Paris, then.</think>Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ENDING = Ending("stop", None, input_tokens=12, output_tokens=30, cached_tokens=0)


def responses(chat_format: ChatFormat = ChatFormat(), **fields):
    return parse_responses_request(json.dumps({"model": MODEL} | fields).encode(), MODEL, chat_format)


def messages(chat_format: ChatFormat = ChatFormat(), **fields):
    body = {"model": MODEL, "max_tokens": 32} | fields
    return parse_messages_request(json.dumps(body).encode(), MODEL, chat_format)


def assert_invalid(result, param: str) -> None:
    assert isinstance(result, Error), result
    assert (result.http_status, result.param) == (400, param), result


def test_responses_input_items_become_the_chat_conversation():
    parsed = responses(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "22 C"},
        ],
        tools=[{"type": "function", "name": "get_weather", "description": "Weather", "parameters": SCHEMA}],
        max_output_tokens=20,
        temperature=0.5,
        reasoning={"effort": "minimal"},
    )
    request = parsed.chat.request
    call = ChatToolCall("call_1", ToolCallFunction("get_weather", {"city": "Paris"}))
    assert request.messages == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=[call]),
        ChatMessage("tool", "22 C", tool_call_id="call_1"),
    ]
    assert request.chat_template.tools[0]["function"] == {
        "name": "get_weather",
        "description": "Weather",
        "parameters": SCHEMA,
    }
    assert request.chat_template.kwargs == {"enable_thinking": False}
    assert (request.params.max_tokens, request.params.temperature) == (20, 0.5)
    assert parsed.chat.reply.tool_format is not None
    assert responses(input="Hi").chat.request.messages == [ChatMessage("user", "Hi")]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": []}, "input"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
        ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": ["Hi", {"type": "function_call_output", "call_id": "nope", "output": "1"}]}, "input[0]"),
        (
            {
                "input": [
                    {"role": "user", "content": "Hi"},
                    {"type": "function_call_output", "call_id": "x", "output": "1"},
                ]
            },
            "input[1].call_id",
        ),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {
                "input": "Hi",
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice",
        ),
        ({"input": "Hi", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "Hi", "temperature": 9}, "temperature"),
        ({"input": "Hi", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "Hi", "store": True}, "store"),
        ({"input": "Hi", "background": True}, "background"),
        ({"input": "Hi", "reasoning": {"effort": "low", "summary": "auto"}}, "reasoning.summary"),
        ({"input": "Hi", "include": ["reasoning.encrypted_content"]}, "include"),
        ({"input": "Hi", "truncation": "auto"}, "truncation"),
        ({"input": [{"type": {}}]}, "input[0].type"),
    ],
)
def test_responses_bad_input_names_the_field(fields, param):
    assert_invalid(responses(**fields), param)


def test_responses_text_format_is_the_chat_routes_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fields = {"type": "json_schema", "name": "A", "schema": schema, "strict": True}
    parsed = responses(input="Hi", text={"format": fields})
    constraint = parsed.chat.request.params.constraint
    assert (constraint.kind, json.loads(constraint.text)) == ("json_schema", schema)
    assert parsed.echo["text"] == {"format": fields}
    assert responses(input="Hi", text={"format": {"type": "json_object"}}).chat.request.params.constraint.kind == (
        "json_object"
    )


def test_responses_take_an_earlier_responses_output_back_as_input():
    """Output items carry ids, statuses and annotations, which mean nothing for the next reply."""
    output = [
        {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": [], "logprobs": []}],
        },
        {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    parsed = responses(
        input=[
            {"role": "user", "content": "Hi"},
            *output,
            {"type": "function_call_output", "call_id": "c1", "output": "1"},
        ]
    )
    call = ChatToolCall("c1", ToolCallFunction("f", {}))
    assert parsed.chat.request.messages == [
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Looking.", tool_calls=[call]),
        ChatMessage("tool", "1", tool_call_id="c1"),
    ]


def test_messages_blocks_become_the_chat_conversation():
    parsed = messages(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": ""},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22 C"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        tools=[{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        top_k=5,
        thinking={"type": "enabled"},
    )
    request = parsed.chat.request
    call = ChatToolCall("toolu_1", ToolCallFunction("get_weather", {"city": "Paris"}))
    assert request.messages == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "Looking.", tool_calls=[call]),
        ChatMessage("tool", "22 C", tool_call_id="toolu_1"),
        ChatMessage("user", "And tomorrow?"),
    ]
    assert (parsed.chat.reply.tool_choice, parsed.chat.reply.parallel) == ("required", False)
    assert (request.params.stop, request.params.top_k, request.params.max_tokens) == (["END"], 5, 32)
    assert request.chat_template.kwargs == {"enable_thinking": True}
    assert parsed.stop_sequences == ["END"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None, "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "Hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0].content[0].type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        (
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "tools": [{"name": "f", "input_schema": {}, "type": "bash_20250124"}],
            },
            "tools[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "tool_choice": {"type": "tool", "name": "g"}},
            "tool_choice",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}], "top_p": 2}, "top_p"),
        ({"messages": [{"role": "user", "content": "Hi"}], "stop_sequences": 3}, "stop_sequences"),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "enabled", "budget_tokens": 1024}},
            "thinking.budget_tokens",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "citations": []}]}]},
            "messages[0].content[0].citations",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}], "system": [{"text": "Be brief."}]}, "system[0].type"),
        ({"messages": [{"role": "user", "content": "Hi"}], "container": "c"}, "container"),
    ],
)
def test_messages_bad_input_names_the_field(fields, param):
    body = {key: value for key, value in fields.items() if value is not None}
    if "max_tokens" in fields and fields["max_tokens"] is None:
        result = parse_messages_request(json.dumps({"model": MODEL} | body).encode(), MODEL, ChatFormat())
    else:
        result = messages(**body)
    assert_invalid(result, param)


def _reader(parsed):
    return ReplyReader(parsed.chat.reply, [])


def _pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _no_call_ids(items: list[dict]) -> list[dict]:
    """Call ids are drawn afresh for every reply read."""
    return [
        {k: v for k, v in item.items() if item["type"] != "function_call" or k not in ("id", "call_id")}
        for item in items
    ]


def test_a_responses_reply_with_thinking_and_a_call_whole_and_streamed():
    tools = [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]
    parsed = responses(THINKING, input="Weather in Paris?", tools=tools)
    dialect = ResponsesDialect(parsed, MODEL)
    whole = dialect.writer("r1", 0, 12).whole(_reader(parsed).push(REPLY, final=True), ENDING)
    response = Response.model_validate(whole)
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output[0].content[0].text == "Paris, then."
    assert response.output_text == "Let me look."
    call = response.output[2]
    assert (call.name, json.loads(call.arguments), call.call_id.startswith("call_")) == (
        "get_weather",
        {"city": "Paris"},
        True,
    )
    assert (response.status, response.usage.total_tokens) == ("completed", 42)

    writer, reader = dialect.writer("r1", 0, 12), _reader(parsed)
    events = writer.start()
    pieces = _pieces(REPLY)
    for i, piece in enumerate(pieces):
        events += writer.add(reader.push(piece, final=i == len(pieces) - 1))
    events += writer.end(ENDING)
    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=[], text_format=omit)
    for number, (name, data) in enumerate(events):
        assert (data["type"], data["sequence_number"]) == (name, number)
        state.handle_event(adapter.validate_python(data))
    streamed = state._completed_response
    assert streamed.output_text == "Let me look."
    assert (streamed.output[2].name, streamed.output[2].arguments) == (call.name, call.arguments)
    assert _no_call_ids(events[-1][1]["response"]["output"]) == _no_call_ids(whole["output"])


def test_a_messages_reply_with_thinking_and_a_call_whole_and_streamed():
    tools = [{"name": "get_weather", "input_schema": SCHEMA}]
    parsed = messages(THINKING, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools)
    dialect = AnthropicDialect(MODEL, [])
    whole = Message.model_validate(dialect.writer("r1", 0, 12).whole(_reader(parsed).push(REPLY, final=True), ENDING))
    assert [block.type for block in whole.content] == ["thinking", "text", "tool_use"]
    assert (whole.content[2].name, whole.content[2].input) == ("get_weather", {"city": "Paris"})
    assert (whole.stop_reason, whole.usage.output_tokens) == ("tool_use", 30)

    writer, reader = dialect.writer("r1", 0, 12), _reader(parsed)
    events = writer.start()
    pieces = _pieces(REPLY)
    for i, piece in enumerate(pieces):
        events += writer.add(reader.push(piece, final=i == len(pieces) - 1))
    events += writer.end(ENDING)
    adapter = TypeAdapter(RawMessageStreamEvent)
    blocks: dict[int, dict] = {}
    for name, data in events:
        event = adapter.validate_python(data)
        assert event.type == name
        if name == "content_block_start":
            blocks[event.index] = data["content_block"] | {"json": ""}
        elif name == "content_block_delta":
            delta = data["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "json"}[delta["type"]]
            blocks[event.index][key] += delta.get(key, delta.get("partial_json", ""))
    assert [b.get("thinking") or b.get("text") or json.loads(b["json"]) for b in blocks.values()] == [
        "Paris, then.",
        "Let me look.",
        {"city": "Paris"},
    ]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("ending", "stop_reason", "sequence"),
    [
        (Ending("length", None, 1, 2, 0), "max_tokens", None),
        (Ending("stop", "END", 1, 2, 0), "stop_sequence", "END"),
        (Ending("stop", 2, 1, 2, 0), "end_turn", None),
    ],
)
def test_messages_stop_reasons(ending, stop_reason, sequence):
    parsed = messages(messages=[{"role": "user", "content": "Hi"}], stop_sequences=["END"])
    whole = AnthropicDialect(MODEL, ["END"]).writer("r", 0, 1).whole(_reader(parsed).push("Hello", final=True), ending)
    assert (whole["stop_reason"], whole["stop_sequence"]) == (stop_reason, sequence)


def test_messages_fields_of_no_meaning_for_generation_are_taken_and_change_nothing():
    cache = {"type": "ephemeral"}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True, "cache_control": cache}
    conversation = [
        {"role": "user", "content": [{"type": "text", "text": "Go", "cache_control": cache}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [result]},
    ]
    taken = messages(messages=conversation, system=[{"type": "text", "text": "Be brief.", "cache_control": cache}])
    plain = messages(
        messages=[
            {
                **m,
                "content": [
                    {k: v for k, v in b.items() if k not in ("cache_control", "is_error")} for b in m["content"]
                ],
            }
            for m in conversation
        ],
        system="Be brief.",
    )
    assert taken.chat.request == plain.chat.request
