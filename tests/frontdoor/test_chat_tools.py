"""The chat request's tool and reasoning fields, checked with the field named, and the replies read
into OpenAI's message parts: the streamed chunks, accumulated by the `openai` SDK's own stream
helper, make up the message of the reply whole."""

import json

import msgspec
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from actors.frontdoor import openai_protocol as protocol
from actors.frontdoor import openai_responses as responses
from actors.frontdoor.chat_reply import delta_fields, message_fields
from actors.lib.chat_format import ChatFormat, think_token_ids
from actors.lib.chat_reply import ReplyOptions
from actors.lib.tool_calls import hermes, mistral
from schemas.errors import Error

MODEL = "m"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
USER = [{"role": "user", "content": "Weather in Paris?"}]
CALLED = [
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
]


def chat(chat_format: ChatFormat = ChatFormat(), **fields):
    body = {"model": MODEL, "messages": USER} | fields
    return protocol.parse_chat_request(json.dumps(body).encode(), MODEL, chat_format)


def assert_invalid(result, param: str, words: str = "") -> None:
    assert isinstance(result, Error), result
    assert (result.http_status, result.param) == (400, param), result
    assert words in result.message


# --- requests ---------------------------------------------------------------------------------------


def test_tools_reach_the_template_and_the_reply_is_read():
    parsed = chat(tools=[WEATHER], chat_template_kwargs={"enable_thinking": False})
    template = parsed.request.chat_template
    assert template.tools[0]["function"]["name"] == "get_weather"
    assert template.tools[0]["function"]["parameters"] == WEATHER["function"]["parameters"]
    assert template.kwargs == {"enable_thinking": False}
    assert parsed.reply.tool_format is hermes.FORMAT and parsed.reply.tool_choice == "auto"
    assert parsed.tool_constraint is None


def test_tool_choice_none_offers_no_tools_and_reads_no_calls():
    parsed = chat(tools=[WEATHER], tool_choice="none")
    assert parsed.request.chat_template is None
    assert parsed.reply == ReplyOptions()


@pytest.mark.parametrize(
    ("choice", "kind"), [("required", "required"), ({"type": "function", "function": {"name": "get_weather"}}, "named")]
)
def test_a_demanded_call_carries_its_constraint(choice, kind):
    parsed = chat(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False)
    assert (parsed.reply.tool_choice, parsed.reply.parallel) == (kind, False)
    assert parsed.tool_constraint.json_schema["maxItems"] == 1
    assert parsed.tool_constraint.structural_tag["type"] == "structural_tag"


def test_a_conversation_with_tool_results_is_kept_whole():
    messages = chat(messages=CALLED, tools=[WEATHER]).request.messages
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    call = messages[1].tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "get_weather", {"city": "Paris"})
    assert (messages[1].content, messages[2].tool_call_id) == ("", "call_1")


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", ""),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name", ""),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "is required"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "two tools"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tool_choice": "sometimes", "tools": [WEATHER]}, "tool_choice", ""),
        ({"tool_choice": {"type": "function", "function": {"name": "launch"}}, "tools": [WEATHER]}, "tool_choice", ""),
        (
            {"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]},
            "tools[0].function.parameters",
            "",
        ),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools", "not a template variable"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs", ""),
        ({"messages": [*USER, {"role": "tool", "content": "1"}]}, "messages[1].tool_call_id", "is required"),
        (
            {"messages": [*CALLED[:2], {"role": "tool", "tool_call_id": "call_9", "content": "1"}]},
            "messages[2].tool_call_id",
            "call_9",
        ),
        (
            {"messages": [*USER, {"role": "user", "content": "x", "tool_calls": CALLED[1]["tool_calls"]}]},
            "messages[1].tool_calls",
            "no such field",  # a user's message has no tool calls
        ),
        (
            {
                "messages": [
                    *USER,
                    {
                        **CALLED[1],
                        "tool_calls": [{**CALLED[1]["tool_calls"][0], "function": {"name": "f", "arguments": "{nope"}}],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
            "not JSON",
        ),
        (
            {"messages": [{"role": "function", "content": "1", "name": "f"}]},
            "messages[0].role",
            "Invalid value 'function'",
        ),
    ],
)
def test_bad_tool_fields_name_the_field(fields, param, words):
    assert_invalid(chat(**fields), param, words)


def test_the_model_s_think_tokens_are_read_from_its_tokenizer(tmp_path):
    assert think_token_ids(tmp_path) is None
    added = [{"id": 9, "content": "<think>"}, {"id": 10, "content": "</think>"}]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"vocab": {"a": 0}}}))
    assert think_token_ids(tmp_path) == (9, 10)
    assert ChatFormat.of_model(str(tmp_path), "auto", "qwen3").think_ids == (9, 10)
    assert ChatFormat.of_model(str(tmp_path), "mistral", "none") == ChatFormat(mistral.FORMAT)


# --- replies ----------------------------------------------------------------------------------------

REPLY = (
    "<think>The user wants weather.</think>\n\nLet me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)


def whole_message(options: ReplyOptions, text: str, finish: str = "stop") -> ChatCompletion:
    reader = options.reader([1, 2, 3])
    parts = message_fields(reader, reader.push(text, final=True))
    choice = responses.chat_choice(0, text, reader.finish_reason(finish), None, parts)
    return ChatCompletion.model_validate(responses.chat_completion_response("r", MODEL, 0, [choice], 3, 9))


def streamed_message(options: ReplyOptions, text: str, step: int, finish: str = "stop") -> ChatCompletion:
    """The text streamed `step` characters a chunk, through the SDK's own accumulator."""
    reader = options.reader([1, 2, 3])
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}  # the SDK parses strict tools' arguments
    state = ChatCompletionStreamState(input_tools=[strict])
    state.handle_chunk(ChatCompletionChunk.model_validate(responses.chat_chunk("r", MODEL, 0, role="assistant")))
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        parts = delta_fields(reader, reader.push(piece, final=last))
        reason = reader.finish_reason(finish) if last else None
        chunk = responses.chat_chunk("r", MODEL, 0, piece, finish_reason=reason, parts=parts)
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion()


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_deltas_make_up_the_whole_message(step):
    options = ReplyOptions(tool_format=hermes.FORMAT, reasoning_parser="qwen3")
    whole = whole_message(options, REPLY).choices[0]
    streamed = streamed_message(options, REPLY, step).choices[0]
    assert whole.finish_reason == streamed.finish_reason == "tool_calls"
    assert whole.message.content == streamed.message.content == "Let me look."
    assert whole.message.reasoning_content == streamed.message.reasoning_content == "The user wants weather."
    for message in (whole.message, streamed.message):
        calls = [(c.type, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
        assert calls == [("function", "get_weather", {"city": "Paris"}), ("function", "get_weather", {"city": "Rome"})]
        assert all(c.id.startswith("call_") for c in message.tool_calls)
    assert streamed.message.tool_calls[0].function.parsed_arguments == {"city": "Paris"}  # the SDK's helper


def test_the_sdks_messages_go_back_into_the_history_as_the_sdk_sends_them():
    """An agent appends the reply's message object to its history; the SDK sends it back with its
    own additions (parsed arguments, a streamed call's index, null refusal and audio), which are
    taken with no effect, reasoning_content too."""
    options = ReplyOptions(tool_format=hermes.FORMAT, reasoning_parser="qwen3")
    for reply in (whole_message(options, REPLY), streamed_message(options, REPLY, 5)):
        sent = reply.choices[0].message.model_dump(exclude_unset=True, mode="json")
        results = [{"role": "tool", "tool_call_id": c["id"], "content": "20 C"} for c in sent["tool_calls"]]
        parsed = chat(tools=[WEATHER], messages=[*USER, sent, *results])
        assistant = parsed.request.messages[1]
        assert (assistant.content, [c.function.arguments for c in assistant.tool_calls]) == (
            "Let me look.",
            [{"city": "Paris"}, {"city": "Rome"}],
        )


def test_a_reply_of_calls_alone_has_no_content_and_a_named_call_stops():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    message = whole_message(ReplyOptions(tool_format=hermes.FORMAT), text).choices[0]
    assert (message.message.content, message.finish_reason) == (None, "tool_calls")
    named = whole_message(ReplyOptions(tool_format=hermes.FORMAT, tool_choice="named"), text).choices[0]
    assert named.finish_reason == "stop"
    cut = whole_message(ReplyOptions(tool_format=hermes.FORMAT), text[:-5], finish="length").choices[0]
    assert cut.finish_reason == "length" and cut.message.tool_calls


def test_include_reasoning_false_leaves_the_thinking_out():
    options = ReplyOptions(reasoning_parser="deepseek-r1", include_reasoning=False)
    message = whole_message(options, "hmm</think>Yes.").choices[0].message
    assert message.content == "Yes." and "reasoning_content" not in message.model_dump(exclude_unset=True)
    assert msgspec.json.encode(delta_fields(options.reader([]), options.reader([]).push("hmm"))) == b"{}"
