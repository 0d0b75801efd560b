"""The gateway takes a bus chat request's tool fields and reads its replies as the HTTP chat route
does: the same tools offered, grammar and options from the same chat format, the same errors naming
the bus's fields, the same parts whole, and every cut of a stream giving the reply read whole."""

import json

import pytest

from actors.frontdoor import openai_protocol as protocol
from actors.gateway.chat_replies import ChoiceReply, chat_request
from actors.lib.chat_format import ChatFormat
from actors.lib.tool_calls import hermes, mistral
from schemas.errors import Error
from schemas.generate import (
    ChatMessage,
    ChatTemplateArgs,
    ChatToolCall,
    Constraint,
    FunctionChoice,
    GenerateRequest,
    NamedToolChoice,
    SamplingParams,
    ToolCallFunction,
)

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
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def named(name: str) -> NamedToolChoice:
    return NamedToolChoice("function", FunctionChoice(name))


def chat(asked: ChatTemplateArgs, params: SamplingParams = SamplingParams()) -> GenerateRequest:
    return GenerateRequest(messages=[ChatMessage("user", "Weather?")], chat_template=asked, params=params)


@pytest.mark.parametrize("tool_choice", [None, "auto", "none", "required", NAMED])
@pytest.mark.parametrize("parallel", [True, False])
def test_a_chat_request_on_the_bus_means_what_it_means_over_http(tool_choice, parallel):
    """The same fields give the same tools offered, the same grammar and the same reading."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}
    body |= {"parallel_tool_calls": parallel} | ({"tool_choice": tool_choice} if tool_choice else {})
    http = protocol.parse_chat_request(json.dumps(body).encode(), "m", THINKING)
    choice = named("get_weather") if tool_choice == NAMED else tool_choice
    bus, options = chat_request(chat(ChatTemplateArgs([WEATHER], {}, choice, parallel)), THINKING)
    assert options == http.reply
    assert bus.chat_template == http.request.chat_template
    grammar = http.request.params.constraint
    assert bus.params.constraint == (grammar and Constraint(grammar.kind, grammar.text, "chat_template.tools"))


def test_what_is_read_and_what_is_not():
    user = [ChatMessage("user", "Hi")]
    assert chat_request(GenerateRequest(text="Hi"), THINKING)[1].reader([]) is None
    assert chat_request(GenerateRequest(input_ids=[1, 2]), THINKING)[1].reader([]) is None
    assert chat_request(GenerateRequest(messages=user), ChatFormat())[1].reader([]) is None  # no tools, no parser
    options = chat_request(GenerateRequest(messages=user), ChatFormat(mistral.FORMAT, "deepseek-r1", (5, 6)))[1]
    assert (options.tool_format, options.reasoning_parser, options.think_ids) == (None, "deepseek-r1", (5, 6))


@pytest.mark.parametrize(
    ("request_", "param", "words"),
    [
        (chat(ChatTemplateArgs([WEATHER], tool_choice=named("launch"))), "tool_choice", "launch"),
        (chat(ChatTemplateArgs(tool_choice="required")), "tool_choice", "needs tools"),
        (
            chat(ChatTemplateArgs([{"type": "function", "function": {"name": "no spaces"}}])),
            "tools[0].function.name",
            "",
        ),
        (chat(ChatTemplateArgs([{"type": "function"}])), "tools[0].function", "required"),
        (chat(ChatTemplateArgs([WEATHER, WEATHER])), "tools[1].function.name", "two tools"),
        (chat(ChatTemplateArgs(kwargs={"tools": []})), "kwargs.tools", "not a template variable"),
        (
            chat(
                ChatTemplateArgs([WEATHER], tool_choice="required"),
                SamplingParams(constraint=Constraint("json_object")),
            ),
            "tool_choice",
            "structured output",
        ),
    ],
)
def test_bad_tool_fields_are_refused_naming_the_bus_field(request_, param, words):
    error = chat_request(request_, THINKING)
    assert isinstance(error, Error), error
    assert (error.param, error.http_status) == (f"chat_template.{param}", 400)
    assert words in error.message


def read(text: str, step: int, finish: str = "stop", options=None):
    """The text in outputs of `step` characters: the chunks' parts, and the reply for the result."""
    reply = ChoiceReply((options or chat_request(chat(ChatTemplateArgs([WEATHER])), THINKING)[1]).reader([]))
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    return [reply.add(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)], reply


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
    _, reply = read(text, 3, options=chat_request(chat(ChatTemplateArgs([WEATHER])), ChatFormat())[1])
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
