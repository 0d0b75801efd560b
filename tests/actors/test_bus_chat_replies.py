"""The gateway reads a bus chat reply as the HTTP chat route reads it: the same options from the
same chat format, the same parts whole, and every cut of a stream giving the reply read whole."""

import json

import pytest

from actors.frontdoor import openai_protocol as protocol
from actors.gateway.chat_replies import ChoiceReply, reply_options
from actors.lib.chat_format import ChatFormat
from actors.lib.tool_calls import hermes, mistral
from schemas.generate import ChatMessage, ChatTemplateArgs, ChatToolCall, GenerateRequest, ToolCallFunction

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
THINKING = ChatFormat(hermes.FORMAT, "qwen3")
REPLY = (
    "<think>The user wants weather.</think>\n\nLet me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_a_chat_request_on_the_bus_is_read_as_over_http(tool_choice):
    """The frontdoor's request is what a bus client sends: both doors read its replies alike."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}
    parsed = protocol.parse_chat_request(json.dumps(body | {"tool_choice": tool_choice}).encode(), "m", THINKING)
    assert reply_options(parsed.request, THINKING) == parsed.reply


def test_what_is_read_and_what_is_not():
    user = [ChatMessage("user", "Hi")]
    assert reply_options(GenerateRequest(text="Hi"), THINKING).reader([]) is None
    assert reply_options(GenerateRequest(input_ids=[1, 2]), THINKING).reader([]) is None
    assert reply_options(GenerateRequest(messages=user), ChatFormat()).reader([]) is None  # no tools, no parser
    options = reply_options(GenerateRequest(messages=user), ChatFormat(mistral.FORMAT, "deepseek-r1", (5, 6)))
    assert (options.tool_format, options.reasoning_parser, options.think_ids) == (None, "deepseek-r1", (5, 6))


def read(text: str, step: int, finish: str = "stop", options=None):
    """The text in outputs of `step` characters: the chunks' parts, and the reply for the result."""
    reply = ChoiceReply((options or reply_options(chat([WEATHER]), THINKING)).reader([]))
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    return [reply.add(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)], reply


def chat(tools: list[dict]) -> GenerateRequest:
    return GenerateRequest(messages=[ChatMessage("user", "Weather?")], chat_template=ChatTemplateArgs(tools))


@pytest.mark.parametrize("step", [1, 2, 5, 13, len(REPLY)])
def test_any_cut_of_the_stream_gives_the_reply_whole(step):
    chunks, reply = read(REPLY, step)
    assert reply.text == "".join(c.text for c in chunks) == "Let me look."
    assert reply.reasoning_content == "".join(c.reasoning_content for c in chunks) == "The user wants weather."
    assert reply.finish_reason("stop") == "tool_calls"
    calls = reply.tool_calls()
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    # The deltas: a call's first piece names it with the id the result gives, the rest is its arguments.
    pieces = [d for c in chunks for d in c.tool_calls]
    assert [(d.index, d.id, d.name) for d in pieces if d.name] == [
        (i, c.id, c.function.name) for i, c in enumerate(calls)
    ]
    assert all(d.id is None for d in pieces if not d.name)
    for index, call in enumerate(calls):
        assert json.loads("".join(d.arguments for d in pieces if d.index == index)) == call.function.arguments
    for chunk in chunks:  # one piece per call in a chunk
        indices = [d.index for d in chunk.tool_calls]
        assert indices == sorted(set(indices))
    assert not any("<tool_call>" in c.text or "<think>" in c.text for c in chunks)


def test_the_calls_go_back_into_the_next_request_as_they_are():
    _, reply = read(REPLY, 4)
    message = ChatMessage("assistant", reply.text, tool_calls=reply.tool_calls())
    assert message.tool_calls[0] == ChatToolCall(
        message.tool_calls[0].id, ToolCallFunction("get_weather", {"city": "Paris"})
    )


def test_a_call_cut_short_keeps_its_text_and_the_length_finish():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    _, reply = read(text, 3, options=reply_options(chat([WEATHER]), ChatFormat()))
    assert reply.finish_reason("length") == "length"
    assert [(c.function.name, c.function.arguments) for c in reply.tool_calls()] == [("get_weather", '{"city": "Par')]


def test_a_reply_nothing_reads_goes_out_as_it_came():
    reply = ChoiceReply(None)
    assert [reply.add(t, final=False).text for t in ("<think>", "a</think>")] == ["<think>", "a</think>"]
    assert (reply.text, reply.reasoning_content, reply.tool_calls(), reply.finish_reason("stop")) == (
        "<think>a</think>",
        "",
        [],
        "stop",
    )
