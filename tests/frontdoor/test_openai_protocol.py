"""OpenAI and SGLang bodies become our requests or a named error; responses match the SDK's types."""

import json
import operator

import msgspec
import openai.types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from actors.frontdoor import openai_protocol as protocol
from actors.frontdoor import openai_responses as responses
from actors.frontdoor import sglang_protocol as sglang
from actors.frontdoor.openai_protocol import OutputOptions, ParsedRequest
from actors.frontdoor.sglang_protocol import GenerateBatch
from schemas.errors import Error
from schemas.generate import ChatMessage, SamplingParams

MODEL = "demo"


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def chat(**fields):
    fields = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]} | fields
    return protocol.parse_chat_request(body(**fields), MODEL)


def completion(**fields):
    return protocol.parse_completion_request(body(**({"model": MODEL, "prompt": "hi"} | fields)), MODEL)


def assert_invalid(result, param: str | None, words: str = "") -> Error:
    assert isinstance(result, Error), result
    assert (result.code, result.http_status, result.param) == ("invalid_request", 400, param), result
    assert words in result.message, result.message
    return result


# --- requests: the body as a whole -------------------------------------------------------------


@pytest.mark.parametrize(
    "parse",
    [
        lambda b: protocol.parse_chat_request(b, MODEL),
        lambda b: protocol.parse_completion_request(b, MODEL),
        sglang.parse_generate_request,
    ],
)
@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"[" * 10_000 + b"]" * 10_000, "must be a JSON object"),
    ],
)
def test_body_that_is_not_a_json_object_is_refused(parse, raw, words):
    assert_invalid(parse(raw), None, words)


def test_deeply_nested_unknown_field_is_refused_not_raised():
    deep = b'{"messages": [{"role": "user", "content": "hi"}], "extra": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    assert_invalid(protocol.parse_chat_request(deep, MODEL), "extra", "not supported")


def test_wrong_types_name_the_field():
    error = assert_invalid(chat(max_tokens="many"), "max_tokens", "Expected `int | null`, got `str`")
    assert "`max_tokens`" in error.message
    assert_invalid(chat(temperature={"a": 1}), "temperature")
    assert_invalid(chat(stream="yes"), "stream")
    assert_invalid(chat(stream_options={"include_usage": 1}), "stream_options.include_usage")
    assert_invalid(chat(messages=[{"role": "user", "content": 5}]), "messages[0].content")
    assert_invalid(chat(messages=[{"content": "hi"}]), "messages[0].role", "is required")
    assert_invalid(protocol.parse_chat_request(body(model=MODEL), MODEL), "messages", "is required")
    assert_invalid(completion(seed=1.5), "seed")
    assert_invalid(completion(ignore_eos=1), "ignore_eos")


def test_fields_of_no_meaning_for_generation_are_taken_and_change_nothing():
    taken = chat(user="u1", metadata={"a": "b"}, store=False, service_tier="auto")
    assert isinstance(taken, ParsedRequest)
    assert taken.request == chat(user="u1").request


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"bad_words": []}, "bad_words", "no such field"),  # vLLM's, not implemented
        ({"store": True}, "store", ""),  # nothing is stored
        ({"stream_options": {"continuous_usage_stats": True}}, "stream_options.continuous_usage_stats", "no such"),
        ({"reasoning_effort": "low"}, "reasoning_effort", "chat_template_kwargs"),
        ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages[0].name", "participant"),
        ({"response_format": {"type": "text", "strict": True}}, "response_format.strict", "no such"),
    ],
)
def test_every_other_field_is_refused_by_name(fields, param, words):
    assert_invalid(chat(**fields), param, words)


def test_integers_written_as_floats_are_integers():
    """JSON has one number type: 16.0 is 16 to JSON Schema, and so to /openapi.json."""
    parsed = completion(prompt=[1.0, 2.0], max_tokens=16.0, n=2.0, stop_token_ids=[3.0], temperature=1)
    assert (parsed.request.input_ids, parsed.request.params.max_tokens, parsed.request.n) == ([1, 2], 16, 2)
    assert parsed.request.params.stop_token_ids == [3]
    assert_invalid(completion(max_tokens=16.5), "max_tokens", "got `float`")


# --- requests: model ----------------------------------------------------------------------------


def test_other_model_is_not_found():
    for result in (chat(model="gpt-5"), completion(model="gpt-5")):
        assert isinstance(result, Error)
        assert (result.code, result.http_status, result.param) == ("not_found", 404, "model")
        assert result.message == "The model `gpt-5` does not exist."


def test_missing_model_means_the_served_one():
    parsed = protocol.parse_chat_request(body(messages=[{"role": "user", "content": "hi"}]), MODEL)
    assert parsed.request.model == MODEL


# --- requests: fields we cannot honour ----------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
    ],
)
def test_chat_features_we_cannot_honour_are_refused(fields, param):
    assert_invalid(chat(**fields), param, "is not supported: OpenAI's deprecated functions")


def test_chat_defaults_of_unsupported_features_pass():
    parsed = chat(tool_choice="none", response_format={"type": "text"}, min_tokens=0, top_logprobs=0)
    assert isinstance(parsed, ParsedRequest)


def test_n_choices_reach_the_request():
    assert chat(n=3).request.n == 3
    assert completion(n=16).request.n == 16
    assert chat().request.n == 1
    assert_invalid(chat(n=0), "n", "")
    assert_invalid(completion(n=129), "n", "")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"best_of": 2}, "best_of"),
        ({"suffix": "end"}, "suffix"),
    ],
)
def test_completion_features_we_cannot_honour_are_refused(fields, param):
    assert_invalid(completion(**fields), param, "is not supported")


# --- requests: chat messages --------------------------------------------------------------------


def test_chat_builds_messages_and_params():
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hi!", "reasoning_content": "a greeting, then"},
        {"role": "user", "content": ""},
    ]
    parsed = chat(messages=messages, temperature=0, stream=True, stream_options={"include_usage": True})
    assert parsed.kind == "chat"
    assert parsed.include_usage_in_stream
    assert parsed.request.messages == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hello\nthere"),
        ChatMessage("assistant", "Hi!"),
        ChatMessage("user", ""),
    ]
    assert parsed.request.text is None and parsed.request.input_ids is None
    assert parsed.request.stream
    assert parsed.request.params == SamplingParams(max_tokens=None, temperature=0.0)


def test_chat_without_max_tokens_leaves_it_to_the_context_window():
    assert chat().request.params.max_tokens is None


def test_chat_takes_either_max_tokens_name():
    assert chat(max_tokens=7).request.params.max_tokens == 7
    assert chat(max_completion_tokens=9).request.params.max_tokens == 9
    assert chat(max_tokens=9, max_completion_tokens=9).request.params.max_tokens == 9
    assert_invalid(chat(max_tokens=7, max_completion_tokens=9), "max_completion_tokens", "not both")
    assert_invalid(chat(max_completion_tokens=0), "max_completion_tokens")


def test_usage_only_streams_when_streaming_and_asked():
    assert not chat(stream=True).include_usage_in_stream
    assert not chat(stream_options={"include_usage": True}).include_usage_in_stream
    assert not chat(stream=True, stream_options={"include_usage": False}).include_usage_in_stream


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        ([], "messages", "length >= 1"),
        ([{"role": "tool", "content": "42", "tool_call_id": "c1"}], "messages[0].tool_call_id", "no earlier tool call"),
        (
            [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}],
            "messages[0].tool_calls[0].function",
            "is required",
        ),
        ([{"role": "robot", "content": "hi"}], "messages[0].role", "Invalid value 'robot'"),
        ([{"role": "user", "content": None}], "messages[0].content", "got `null`"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content[0].type",
            "Invalid enum value 'image_url'",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text", "is required"),
        ([{"role": "user", "tool_call_id": "c1", "content": "x"}], "messages[0].tool_call_id", "not supported"),
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}"}}],
                }
            ],
            "messages[0].tool_calls[0].type",
            "Invalid enum value 'custom'",
        ),
        ("hi", "messages", "Expected `array`"),
    ],
)
def test_bad_messages_are_refused(messages, param, words):
    assert_invalid(chat(messages=messages), param, words)


# --- requests: completion prompts ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "text", "ids"),
    [
        ("Once upon", "Once upon", None),
        (["Once upon"], "Once upon", None),
        ([1, 2, 3], None, [1, 2, 3]),
        ([[4, 5]], None, [4, 5]),
    ],
)
def test_completion_prompt_forms(prompt, text, ids):
    parsed = completion(prompt=prompt)
    assert (parsed.kind, parsed.request.text, parsed.request.input_ids) == ("completion", text, ids)
    assert parsed.request.params.max_tokens == 16  # OpenAI's default for completions
    assert parsed.request.model == MODEL and not parsed.request.stream


@pytest.mark.parametrize(
    ("prompt", "param", "words"),
    [
        (["a", "b"], "prompt", "batched prompts are not supported yet"),
        ([[1], [2]], "prompt", "batched prompts are not supported yet"),
        ("", "prompt", "length >= 1"),
        ([], "prompt", "length >= 1"),
        ([""], "prompt", "empty"),
        ([[]], "prompt", "empty"),
        ([1, "a"], "prompt[1]", "token ids"),
        ([1, True], "prompt[1]", "token ids"),
        ([-1], "prompt[0]", "token ids"),
        ([2**40], "prompt[0]", "token ids"),
        ([[1, 2.5]], "prompt[1]", "token ids"),
        (5, "prompt", "Expected"),
        (None, "prompt", "Expected"),
    ],
)
def test_bad_prompts_are_refused(prompt, param, words):
    assert_invalid(completion(prompt=prompt), param, words)


def test_completion_without_prompt_is_refused():
    assert_invalid(protocol.parse_completion_request(body(model=MODEL), MODEL), "prompt", "is required")


# --- requests: sampling -------------------------------------------------------------------------


def test_sampling_fields_reach_sampling_params():
    parsed = completion(
        max_tokens=30,
        temperature=0.7,
        top_p=0.9,
        top_k=50,
        min_p=0.05,
        seed=2**63 - 1,
        stop="\n",
        stop_token_ids=[2, 7],
        ignore_eos=True,
        skip_special_tokens=False,
        stream=True,
    )
    assert parsed.request.params == SamplingParams(
        max_tokens=30,
        temperature=0.7,
        top_p=0.9,
        top_k=50,
        min_p=0.05,
        seed=2**63 - 1,
        stop=["\n"],
        stop_token_ids=[2, 7],
        ignore_eos=True,
        skip_special_tokens=False,
    )
    assert parsed.request.stream


def test_null_sampling_fields_mean_the_defaults():
    nulls = dict.fromkeys(
        [
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "skip_special_tokens",
            "stream",
            "n",
            "logprobs",
        ]
    )
    assert completion(**nulls).request.params == SamplingParams()


def test_edge_values_are_accepted():
    params = completion(temperature=2, top_p=1, top_k=-1, seed=-(2**63), stop=["a"] * 16).request.params
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (2.0, 1.0, -1, -(2**63))
    assert completion(top_k=0, temperature=0).request.params.top_k == 0
    assert [chat(min_p=p).request.params.min_p for p in (0, 1)] == [0.0, 1.0]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_tokens": 2**70}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.01}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"min_p": -0.01}, "min_p"),
        ({"min_p": 1.01}, "min_p"),
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"stop": ""}, "stop"),
        ({"stop": ["a", ""]}, "stop[1]"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stop": [1]}, "stop[0]"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
        ({"stop_token_ids": 3}, "stop_token_ids"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
    ],
)
def test_sampling_out_of_range_is_refused(fields, param):
    assert_invalid(completion(**fields), param)
    assert_invalid(chat(**fields), param)


# --- requests: logprobs, echo and vLLM's extras -------------------------------------------------


def test_chat_logprobs_ask_for_the_chosen_tokens_and_their_alternatives():
    parsed = chat(logprobs=True, top_logprobs=5)
    assert parsed.output == OutputOptions(logprobs=5)
    params = parsed.request.params
    assert (params.logprobs, params.top_logprobs, params.prompt_logprobs_from) == (True, 5, None)
    assert chat(logprobs=True).output.logprobs == 0
    assert chat(logprobs=False, top_logprobs=0).output.logprobs is None
    assert not chat().request.params.logprobs


def test_completion_logprobs_and_echo_score_the_prompt():
    parsed = completion(logprobs=3, echo=True)
    assert parsed.output == OutputOptions(logprobs=3, echo=True)
    params = parsed.request.params
    assert (params.logprobs, params.top_logprobs, params.prompt_logprobs_from) == (True, 3, 0)
    zero = completion(logprobs=0).request.params
    assert (zero.logprobs, zero.top_logprobs, zero.prompt_logprobs_from) == (True, 0, None)
    echo_only = completion(echo=True)
    assert echo_only.output.echo and echo_only.request.params.prompt_logprobs_from is None
    # The text of an echoed prompt of token ids comes with their logprobs.
    assert completion(prompt=[4, 5], echo=True).request.params.prompt_logprobs_from == 0


def test_vllm_extras_reach_the_request():
    parsed = chat(prompt_logprobs=2, return_token_ids=True, return_tokens_as_token_ids=True, cache_salt="s1")
    assert parsed.output == OutputOptions(prompt_logprobs=2, return_token_ids=True, tokens_as_ids=True)
    params = parsed.request.params
    assert (params.logprobs, params.top_logprobs, params.prompt_logprobs_from) == (False, 2, 0)
    assert parsed.request.cache_salt == "s1"
    # One top_logprobs serves the prompt and the output: the larger of the two.
    assert completion(logprobs=1, prompt_logprobs=4).request.params.top_logprobs == 4


def test_sampling_controls_reach_sampling_params():
    parsed = completion(
        min_tokens=3,
        presence_penalty=0.5,
        frequency_penalty=-1,
        repetition_penalty=1.2,
        logit_bias={"7": -100, "12": 2.5},
        allowed_token_ids=[1, 2, 3],
        disallowed_token_ids=[4],
        temperature=1.5,
        final_temperature=0.5,
        temperature_schedule_tokens=10,
        stop_regex=["\\d+\\."],
        include_stop_str_in_output=True,
    )
    assert parsed.request.params == SamplingParams(
        max_tokens=16,
        temperature=1.5,
        min_tokens=3,
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        repetition_penalty=1.2,
        logit_bias={7: -100.0, 12: 2.5},
        allowed_token_ids=[1, 2, 3],
        disallowed_token_ids=[4],
        final_temperature=0.5,
        temperature_schedule_tokens=10,
        stop_regex=["\\d+\\."],
        include_stop_str_in_output=True,
    )
    assert chat(stop_regex="a+").request.params.stop_regex == ["a+"]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "<= 20"),
        ({"top_logprobs": 2}, "top_logprobs", "needs logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs", "<= 20"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "streaming"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "matching regex"),
        ({"logit_bias": {"-3": 1}}, "logit_bias", "matching regex"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "<= 100"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "length >= 1"),
        ({"stop_regex": "(unclosed"}, "stop_regex", "not a valid regular expression"),
        ({"stop_regex": ["ok", "[z-a]"]}, "stop_regex", "not a valid regular expression"),
        ({"presence_penalty": 2.5}, "presence_penalty", "<= 2.0"),
        ({"repetition_penalty": 0}, "repetition_penalty", "> 0.0"),
        ({"min_tokens": -1}, "min_tokens", ">= 0"),
    ],
)
def test_bad_logprob_and_control_fields_name_the_field(fields, param, words):
    assert_invalid(chat(**fields), param, words)


@pytest.mark.parametrize(("fields", "param"), [({"logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs")])
def test_completion_logprobs_out_of_range_are_refused(fields, param):
    assert_invalid(completion(**fields), param, "")


# --- requests: no body makes a parser raise -----------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "stream",
        "stream_options",
        "n",
        "logprobs",
        "tools",
        "response_format",
        "echo",
        "text",
        "input_ids",
        "sampling_params",
        "role",
        "content",
        "type",
        "include_usage",
        "max_new_tokens",
    ]
)
# Good bodies with a few fields replaced, so arbitrary values reach the validation past the decoder.
good_bodies = st.sampled_from(
    [
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        {"model": MODEL, "prompt": "hi"},
        {"text": "hi", "sampling_params": {"max_new_tokens": 4}},
    ]
)
json_bodies = json_values | st.builds(operator.or_, good_bodies, st.dictionaries(field_names, json_values, max_size=3))


@settings(max_examples=400, deadline=None)
@given(json_bodies)
def test_any_json_body_gives_a_request_or_an_error(value):
    raw = msgspec.json.encode(value)
    for result in (
        protocol.parse_chat_request(raw, MODEL),
        protocol.parse_completion_request(raw, MODEL),
        sglang.parse_generate_request(raw),
    ):
        assert isinstance(result, ParsedRequest | GenerateBatch | Error)
        if isinstance(result, ParsedRequest):
            msgspec.msgpack.encode(result.request)  # what reached a request must cross the bus
        if isinstance(result, GenerateBatch):
            for item in result.items:
                msgspec.msgpack.encode(item.request)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_give_a_request_or_an_error(raw):
    for result in (
        protocol.parse_chat_request(raw, MODEL),
        protocol.parse_completion_request(raw, MODEL),
        sglang.parse_generate_request(raw),
    ):
        assert isinstance(result, ParsedRequest | GenerateBatch | Error)


# --- responses, checked against the official SDK's types ----------------------------------------


def through_json(payload: dict) -> dict:
    return json.loads(responses.sse_event(payload).removeprefix(b"data: ").removesuffix(b"\n\n"))


def test_chat_completion_matches_the_sdk():
    choices = [responses.chat_choice(0, "Hello!", "stop")]
    d = through_json(responses.chat_completion_response("abc", MODEL, 1700000000, choices, 5, 2))
    reply = ChatCompletion.model_validate(d, strict=True)
    assert (reply.id, reply.object, reply.model, reply.created) == (
        "chatcmpl-abc",
        "chat.completion",
        MODEL,
        1700000000,
    )
    assert (reply.choices[0].message.role, reply.choices[0].message.content) == ("assistant", "Hello!")
    assert reply.choices[0].finish_reason == "stop"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (5, 2, 7)


def test_completion_matches_the_sdk():
    choices = [responses.completion_choice(0, " river", "length")]
    d = through_json(responses.completion_response("abc", MODEL, 1700000000, choices, 3, 9))
    reply = openai.types.Completion.model_validate(d, strict=True)
    assert (reply.id, reply.object) == ("cmpl-abc", "text_completion")
    assert (reply.choices[0].text, reply.choices[0].finish_reason, reply.choices[0].index) == (" river", "length", 0)
    assert reply.usage.total_tokens == 12


def test_chat_stream_chunks_match_the_sdk():
    first = ChatCompletionChunk.model_validate(through_json(responses.chat_chunk("r", MODEL, 1, role="assistant")))
    middle = ChatCompletionChunk.model_validate(through_json(responses.chat_chunk("r", MODEL, 1, delta_text="Hi")))
    last = ChatCompletionChunk.model_validate(
        through_json(responses.chat_chunk("r", MODEL, 1, delta_text="", finish_reason="length"))
    )
    assert (first.id, first.object) == ("chatcmpl-r", "chat.completion.chunk")
    assert (first.choices[0].delta.role, first.choices[0].delta.content) == ("assistant", "")
    assert (middle.choices[0].delta.role, middle.choices[0].delta.content) == (None, "Hi")
    assert middle.choices[0].finish_reason is None
    assert (last.choices[0].delta.content, last.choices[0].finish_reason) == (None, "length")


def test_completion_stream_chunks_match_the_sdk():
    middle = through_json(responses.completion_chunk("r", MODEL, 1, "A"))
    last = through_json(responses.completion_chunk("r", MODEL, 1, "", "stop"))
    # The SDK builds stream chunks without validating, since its type requires a finish_reason.
    chunk = openai.types.Completion.model_validate(last, strict=True)
    assert (chunk.id, chunk.object, chunk.choices[0].text, chunk.choices[0].finish_reason) == (
        "cmpl-r",
        "text_completion",
        "",
        "stop",
    )
    assert middle["choices"] == [{"index": 0, "text": "A", "logprobs": None, "finish_reason": None}]
    assert {k: v for k, v in middle.items() if k != "choices"} == {k: v for k, v in last.items() if k != "choices"}


def test_usage_chunks_match_the_sdk():
    chat_usage = ChatCompletionChunk.model_validate(through_json(responses.usage_chunk("chat", "r", MODEL, 1, 4, 6)))
    assert (chat_usage.id, chat_usage.choices, chat_usage.usage.total_tokens) == ("chatcmpl-r", [], 10)
    text_usage = openai.types.Completion.model_validate(
        through_json(responses.usage_chunk("completion", "r", MODEL, 1, 4, 6))
    )
    assert (text_usage.id, text_usage.object, text_usage.choices, text_usage.usage.completion_tokens) == (
        "cmpl-r",
        "text_completion",
        [],
        6,
    )


def test_sse_framing():
    assert responses.sse_event({"a": [1, "é"]}) == 'data: {"a":[1,"é"]}\n\n'.encode()
    assert responses.SSE_DONE == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (Error("invalid_request", "max_tokens must be at least 1", param="max_tokens"), "invalid_request_error"),
        (Error("context_length_exceeded", "too long"), "invalid_request_error"),
        (Error("not_found", "The model `x` does not exist.", param="model"), "not_found_error"),
        (Error("overloaded", "busy", retriable=True), "rate_limit_error"),
        (Error("internal", "boom"), "server_error"),
        (Error("timeout", "slow"), "server_error"),
    ],
)
def test_error_body_has_openai_shape(error, kind):
    assert through_json(responses.error_body(error)) == {
        "error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}
    }


def test_models_response_matches_the_sdk():
    d = through_json(responses.models_response(MODEL, 1700000000))
    assert d["object"] == "list"
    models = [openai.types.Model.model_validate(m, strict=True) for m in d["data"]]
    assert [(m.id, m.object, m.created, m.owned_by) for m in models] == [(MODEL, "model", 1700000000, "kernel")]
