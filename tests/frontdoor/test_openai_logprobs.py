"""Logprobs in OpenAI's exact shapes (checked against the official SDK's types) and vLLM's
prompt_logprobs."""

import json

import openai.types
from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from actors.frontdoor import openai_responses as responses
from actors.frontdoor.choice_output import LogprobRun
from actors.frontdoor.openai_logprobs import LOWEST_LOGPROB, CompletionLogprobs, chat_logprobs, prompt_logprobs
from schemas.generate import TokenLogprobs

TEXTS = {1: "<s>", 2: "Hi", 3: " there", 5: "!", 6: "é", 9: "?"}
OUTPUT = TokenLogprobs(0, [-0.5, -1.25], [[5, 9], [9, 6]], [[-0.5, -2.0], [-0.75, -1.25]])
PROMPT = TokenLogprobs(1, [-3.0, -0.125], [[2, 9], [9, 3]], [[-3.0, -4.0], [-0.1, -0.125]])


def through_json(payload: dict) -> dict:
    return json.loads(responses.sse_event(payload).removeprefix(b"data: ").removesuffix(b"\n\n"))


def test_chat_logprobs_have_openais_shape():
    logprobs = chat_logprobs([5, 6], OUTPUT, TEXTS, top_n=1)
    assert logprobs == {
        "content": [
            {
                "token": "!",
                "logprob": -0.5,
                "bytes": [33],
                "top_logprobs": [{"token": "!", "logprob": -0.5, "bytes": [33]}],
            },
            {
                "token": "é",
                "logprob": -1.25,
                "bytes": [195, 169],
                "top_logprobs": [{"token": "?", "logprob": -0.75, "bytes": [63]}],
            },
        ],
        "refusal": None,
    }
    body = responses.chat_completion_response(
        "abc", "demo", 1, [responses.chat_choice(0, "!é", "length", logprobs)], 3, 2
    )
    reply = ChatCompletion.model_validate(through_json(body), strict=True)
    content = reply.choices[0].logprobs.content
    assert [(c.token, c.logprob, c.bytes) for c in content] == [("!", -0.5, [33]), ("é", -1.25, [195, 169])]
    assert content[1].top_logprobs[0].token == "?"


def test_chat_stream_chunk_carries_its_tokens_logprobs():
    chunk = responses.chat_chunk("r", "demo", 1, "!", logprobs=chat_logprobs([5], OUTPUT, TEXTS, top_n=0))
    parsed = ChatCompletionChunk.model_validate(through_json(chunk))
    assert (
        parsed.choices[0].logprobs.content[0].token == "!" and parsed.choices[0].logprobs.content[0].top_logprobs == []
    )


def test_tokens_without_text_are_named_by_id():
    logprobs = chat_logprobs([5], OUTPUT, {}, top_n=1)
    assert logprobs["content"][0]["token"] == "token_id:5"
    assert chat_logprobs([5], OUTPUT, TEXTS, top_n=0, as_ids=True)["content"][0]["token"] == "token_id:5"


def test_minus_infinity_is_reported_as_vllm_does():
    filtered = TokenLogprobs(0, [float("-inf")], [[5]], [[float("-inf")]])
    entry = chat_logprobs([5], filtered, TEXTS, top_n=1)["content"][0]
    assert entry["logprob"] == LOWEST_LOGPROB and entry["top_logprobs"][0]["logprob"] == LOWEST_LOGPROB


def test_completion_logprobs_with_echo():
    pieces = CompletionLogprobs(1, TEXTS)
    pieces.add_prompt([1, 2, 3], PROMPT)
    pieces.add_output([5, 6], OUTPUT)
    body = pieces.take()
    assert body == {
        "tokens": ["<s>", "Hi", " there", "!", "é"],
        "token_logprobs": [None, -3.0, -0.125, -0.5, -1.25],
        "top_logprobs": [None, {"Hi": -3.0}, {" there": -0.125, "?": -0.1}, {"!": -0.5}, {"é": -1.25, "?": -0.75}],
        "text_offset": [0, 3, 5, 11, 12],
    }
    choice = responses.completion_choice(0, "<s>Hi there!é", "length", body)
    # The echoed prompt's first token has no logprob: null, as OpenAI and vLLM give it, which the
    # SDK's types do not foresee; the SDK reads replies without validating them, as here.
    reply = construct_type(
        type_=openai.types.Completion, value=through_json(responses.completion_response("c", "demo", 1, [choice], 3, 2))
    )
    assert reply.choices[0].logprobs.token_logprobs[0] is None
    assert reply.choices[0].logprobs.top_logprobs[3] == {"!": -0.5}


def test_completion_logprobs_in_pieces_keep_their_offsets():
    pieces = CompletionLogprobs(0, TEXTS)
    pieces.add_output([5], OUTPUT)
    first = pieces.take()
    pieces.add_output([6], TokenLogprobs(1, [-1.25]))
    second = pieces.take()
    assert (first["tokens"], first["text_offset"], first["top_logprobs"]) == (["!"], [0], [{"!": -0.5}])
    assert (second["tokens"], second["token_logprobs"], second["text_offset"]) == (["é"], [-1.25], [1])


def test_vllm_prompt_logprobs():
    run = LogprobRun()
    run.extend(PROMPT)
    assert prompt_logprobs([1, 2, 3], run, TEXTS, top_n=1) == [
        None,
        {"2": {"logprob": -3.0, "rank": 1, "decoded_token": "Hi"}},
        {
            "3": {"logprob": -0.125, "rank": 2, "decoded_token": " there"},
            "9": {"logprob": -0.1, "rank": 1, "decoded_token": "?"},
        },
    ]
    assert prompt_logprobs([1, 2], LogprobRun(), TEXTS, top_n=1) == [None, None]
