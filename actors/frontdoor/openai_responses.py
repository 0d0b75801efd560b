"""OpenAI response bodies, stream chunks and error bodies, as dicts ready to encode.

The HTTP handlers do the writing; these only fix the shapes, which the tests check against the
official `openai` SDK's types. Ids are our request ids with OpenAI's prefixes.
"""

from typing import Literal

import msgspec
from aiohttp import web

from schemas.errors import Error

SSE_DONE = b"data: [DONE]\n\n"
_json = msgspec.json.Encoder()

_ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}
_CHUNK_OBJECT = {"chat": "chat.completion.chunk", "completion": "text_completion"}

# OpenAI's error `type` for the statuses that have their own; other 4xx are invalid requests.
_ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


def sse_event(payload: dict) -> bytes:
    return b"data: " + _json.encode(payload) + b"\n\n"


def json_body(payload: dict | list) -> web.Response:
    """A JSON answer, encoded by msgspec: quick for long logprob lists, and a float JSON cannot
    hold (a filtered token's -inf) becomes null, as SGLang's encoder writes it."""
    return web.Response(body=_json.encode(payload), content_type="application/json")


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _envelope(kind: str, obj: str, request_id: str, model: str, created: int, choices: list) -> dict:
    return {"id": _ID_PREFIX[kind] + request_id, "object": obj, "created": created, "model": model, "choices": choices}


def chat_choice(
    index: int,
    text: str,
    finish_reason: str | None,
    logprobs: dict | None = None,
    parts: dict | None = None,
    **extra,
) -> dict:
    """`parts`: the message read from the text (content, reasoning_content, tool_calls), in its
    place; `extra`: vLLM's additions to a choice (`token_ids`)."""
    message = {"role": "assistant"} | (parts if parts is not None else {"content": text})
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason} | extra


def completion_choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None, **extra) -> dict:
    """`extra`: vLLM's additions to a choice (`prompt_logprobs`, `prompt_token_ids`, `token_ids`)."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason} | extra


def chat_completion_response(
    request_id: str,
    model: str,
    created: int,
    choices: list[dict],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    **extra,
) -> dict:
    """`choices`: from `chat_choice`; the usage counts the prompt once, every choice's tokens.
    `extra`: vLLM's additions to the body (`prompt_token_ids`, `prompt_logprobs`)."""
    body = _envelope("chat", "chat.completion", request_id, model, created, choices)
    return body | {"usage": _usage(prompt_tokens, completion_tokens, cached_tokens)} | extra


def completion_response(
    request_id: str,
    model: str,
    created: int,
    choices: list[dict],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict:
    body = _envelope("completion", "text_completion", request_id, model, created, choices)
    return body | {"usage": _usage(prompt_tokens, completion_tokens, cached_tokens)}


def chat_chunk(
    request_id: str,
    model: str,
    created: int,
    delta_text: str | None = None,
    role: str | None = None,
    finish_reason: str | None = None,
    index: int = 0,
    logprobs: dict | None = None,
    parts: dict | None = None,
    content: str | None = "",
) -> dict:
    """The first chunk of a stream gives the role (with `content`: empty, or null before a reply
    that is a tool call, as OpenAI does); the last gives the finish_reason, with an empty delta when
    it brings no text. `parts`: the delta read from the text (content, reasoning_content,
    tool_calls), in place of `delta_text`."""
    delta: dict = {}
    if role is not None:
        delta = {"role": role, "content": content}
    elif parts is not None:
        delta = parts
    elif delta_text:
        delta = {"content": delta_text}
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return _envelope("chat", _CHUNK_OBJECT["chat"], request_id, model, created, [choice])


def completion_chunk(
    request_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None = None,
    index: int = 0,
    logprobs: dict | None = None,
) -> dict:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    return _envelope("completion", _CHUNK_OBJECT["completion"], request_id, model, created, [choice])


def usage_chunk(
    kind: Literal["chat", "completion"],
    request_id: str,
    model: str,
    created: int,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict:
    """The extra last chunk OpenAI sends when `stream_options.include_usage` is set."""
    body = _envelope(kind, _CHUNK_OBJECT[kind], request_id, model, created, [])
    return body | {"usage": _usage(prompt_tokens, completion_tokens, cached_tokens)}


def error_body(error: Error) -> dict:
    status = error.http_status
    kind = "server_error" if status >= 500 else _ERROR_TYPES.get(status, "invalid_request_error")
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}}


def models_response(model: str, created: int, owned_by: str = "kernel") -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": owned_by}]}
