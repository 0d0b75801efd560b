"""OpenAI's Responses API and Anthropic's Messages through the whole system with the default model,
called by the `openai` and `anthropic` SDKs unchanged: whole and streamed replies (the stream
gathered by each SDK's own helper is the reply whole), a conversation with tool history continues,
and bad input is a 400 in each protocol's own error shape, naming the field, after which the
server keeps serving.

This 135M model writes no tool calls of its own; reading a call out of a reply into each dialect's
shapes is tested on the translation itself (tests/frontdoor/test_dialects.py).
"""

import anthropic
import httpx
import openai
import pytest

from kernel.model_source import DEFAULT_MODEL

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
QUESTION = "What is the capital of France? Answer in one sentence."  # the model answers and ends
GREEDY = {"model": DEFAULT_MODEL, "temperature": 0}
# Anthropic's newest SDK no longer sends sampling fields (its newest models refuse them); older ones do.
CLAUDE_GREEDY = {"model": DEFAULT_MODEL, "extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def claude(chat_server):
    return anthropic.Anthropic(base_url=chat_server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_responses_whole_and_streamed(chat_client):
    args = GREEDY | {"input": [{"role": "user", "content": QUESTION}], "max_output_tokens": 30}
    whole = chat_client.responses.create(**args)
    assert whole.status == "completed"  # the model ends its answer: the SDK's stream helper needs that
    assert "Paris" in whole.output_text and whole.output[0].type == "message"
    assert whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens < 30
    with chat_client.responses.stream(**args) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        streamed = stream.get_final_response()
    assert "".join(deltas) == streamed.output_text == whole.output_text
    events = list(chat_client.responses.create(**args, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")


def test_responses_tool_history_continues(chat_client):
    reply = chat_client.responses.create(
        **GREEDY,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "22 degrees and sunny"},
        ],
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}],
        max_output_tokens=4,
    )
    assert reply.output and reply.usage.output_tokens > 0
    assert all(item.type in ("message", "function_call") for item in reply.output)


def test_messages_whole_and_streamed(claude):
    args = CLAUDE_GREEDY | {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 30}
    whole = claude.messages.create(**args)
    assert whole.role == "assistant" and whole.content[0].type == "text" and "Paris" in whole.content[0].text
    assert whole.stop_reason == "end_turn"
    assert whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens < 30
    with claude.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        streamed = stream.get_final_message()
    assert text == streamed.content[0].text == whole.content[0].text
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)


def test_messages_tool_history_continues(claude):
    reply = claude.messages.create(
        **CLAUDE_GREEDY,
        max_tokens=4,
        tools=[{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER_SCHEMA}],
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "22 degrees"}]},
        ],
    )
    assert reply.content and reply.usage.output_tokens > 0
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_bad_input_in_each_protocols_shape_and_the_server_keeps_serving(chat_client, claude, chat_server):
    with pytest.raises(openai.BadRequestError) as refused:
        chat_client.responses.create(model=DEFAULT_MODEL, input="Hi", previous_response_id="resp_1")
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as refused:
        chat_client.responses.create(
            model=DEFAULT_MODEL, input=[{"type": "function_call_output", "call_id": "x", "output": "1"}]
        )
    assert refused.value.body["param"] == "input[0].call_id"
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model=DEFAULT_MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}], extra_body={"top_p": 2}
        )
    assert refused.value.body["type"] == "error"
    assert (
        refused.value.body["error"]["type"] == "invalid_request_error"
        and "top_p" in refused.value.body["error"]["message"]
    )
    hi = [{"role": "user", "content": "Hi"}]
    raw = httpx.post(f"{chat_server.base_url}/v1/messages", json={"model": DEFAULT_MODEL, "messages": hi}, timeout=30)
    assert raw.status_code == 400 and "max_tokens" in raw.json()["error"]["message"]
    reply = claude.messages.create(model=DEFAULT_MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert reply.usage.output_tokens > 0
