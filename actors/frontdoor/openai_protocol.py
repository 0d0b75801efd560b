"""OpenAI's chat and completions bodies in, our `GenerateRequest` out: the HTTP edge's validation.

Pure functions with no I/O, so the HTTP handlers stay thin. A body either becomes a
`ParsedRequest` or an `Error` that names the field at fault; a field we cannot honour is
refused rather than ignored, so a client never gets output it did not ask for. The native
routes' bodies are in `native_protocol`; the response builders live in `openai_responses` and
are re-exported here for the handlers.
"""

from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.openai_responses import (  # noqa: F401  (re-exported for the HTTP handlers)
    SSE_DONE,
    chat_chunk,
    chat_completion_response,
    completion_chunk,
    completion_response,
    error_body,
    models_response,
    sse_event,
    usage_chunk,
)
from actors.frontdoor.request_fields import (
    Id,
    ParsedRequest,
    SamplingFields,
    decode_body,
    invalid,
    sampling_params,
    session_turn,
)
from schemas.errors import Error
from schemas.generate import MAX_CHOICES, ChatMessage, GenerateRequest, TokenCount, TokenId

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class ResponseFormat(msgspec.Struct):
    type: str


class OpenAIFields(SamplingFields, kw_only=True):
    """Fields shared by chat and completions. Unknown fields are ignored (clients send many),
    but the ones listed must have the right type, and those we cannot honour are refused."""

    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    user: str | None = None  # names the tenant when no API keys are configured
    # A turn of a session (POST /v1/sessions): the prompt continues the parent turn's conversation.
    session_id: Id | None = None
    session_parent: Id | None = None  # the id of the turn to continue; default: the latest
    session_replace: bool | None = None  # drop the turns after the parent once this one is done


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class OpenAIMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[Any] | None = None


class ChatCompletionRequest(OpenAIFields, kw_only=True):
    messages: list[OpenAIMessage]
    max_completion_tokens: TokenCount | None = None  # the newer name of max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(OpenAIFields, kw_only=True):
    # str, [str], [int] or [[int]]; msgspec cannot tell two array types apart in one union.
    prompt: str | list[Any]
    echo: bool | None = None
    best_of: Annotated[int, msgspec.Meta(ge=1)] | None = None
    logprobs: int | None = None  # even 0 asks for the chosen token's logprob
    suffix: str | None = None


def parse_chat_request(body: bytes, served_model: str) -> ParsedRequest | Error:
    req = decode_body(body, ChatCompletionRequest)
    if isinstance(req, Error):
        return req
    error = _check_model(req.model, served_model) or _refuse_unsupported(_chat_unsupported(req))
    if error:
        return error
    messages = _chat_messages(req.messages)
    if isinstance(messages, Error):
        return messages
    if req.max_tokens is not None and req.max_completion_tokens not in (None, req.max_tokens):
        return invalid("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    max_tokens = req.max_completion_tokens or req.max_tokens  # None: up to the context window
    return _openai_parsed("chat", req, GenerateRequest(messages=messages), max_tokens, served_model)


def parse_completion_request(body: bytes, served_model: str) -> ParsedRequest | Error:
    req = decode_body(body, CompletionRequest)
    if isinstance(req, Error):
        return req
    error = _check_model(req.model, served_model) or _refuse_unsupported(_completion_unsupported(req))
    if error:
        return error
    prompt = _completion_prompt(req.prompt)
    if isinstance(prompt, Error):
        return prompt
    max_tokens = req.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS
    return _openai_parsed("completion", req, prompt, max_tokens, served_model)


def _check_model(model: str | None, served_model: str) -> Error | None:
    # OpenAI requires `model`; we take a missing one to mean the model we serve.
    if model is not None and model != served_model:
        return Error("not_found", f"The model `{model}` does not exist.", param="model")
    return None


def _common_unsupported(req: OpenAIFields) -> dict[str, bool]:
    return {
        "presence_penalty": bool(req.presence_penalty),
        "frequency_penalty": bool(req.frequency_penalty),
        "logit_bias": bool(req.logit_bias),
        "min_tokens": bool(req.min_tokens),
    }


def _chat_unsupported(req: ChatCompletionRequest) -> dict[str, bool]:
    return _common_unsupported(req) | {
        "logprobs": bool(req.logprobs),
        "top_logprobs": bool(req.top_logprobs),
        "tools": bool(req.tools),
        # With no tools, "none" and "auto" both mean plain text, which is what we give.
        "tool_choice": req.tool_choice not in (None, "none", "auto"),
        "functions": bool(req.functions),
        "function_call": req.function_call not in (None, "none", "auto"),
        "response_format": req.response_format is not None and req.response_format.type != "text",
    }


def _completion_unsupported(req: CompletionRequest) -> dict[str, bool]:
    return _common_unsupported(req) | {
        "echo": bool(req.echo),
        "best_of > 1": (req.best_of or 1) > 1,
        "logprobs": req.logprobs is not None,
        "suffix": bool(req.suffix),
    }


def _refuse_unsupported(asked: dict[str, bool]) -> Error | None:
    for feature, is_asked in asked.items():
        if is_asked:
            return invalid(f"{feature} is not supported yet", feature.split(" ")[0])
    return None


def _chat_messages(messages: list[OpenAIMessage]) -> list[ChatMessage] | Error:
    if not messages:
        return invalid("messages must not be empty", "messages")
    parsed = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        role = "system" if message.role == "developer" else message.role  # OpenAI's newer name
        if role in ("tool", "function") or message.tool_calls:
            return invalid("tool calls and tool messages are not supported yet", param)
        if role not in ("system", "user", "assistant"):
            return invalid(f"unknown role `{message.role}`", f"{param}.role")
        content = _message_text(message.content, role, f"{param}.content")
        if isinstance(content, Error):
            return content
        parsed.append(ChatMessage(role, content))
    if not any(m.content for m in parsed):
        return invalid("messages are empty: every content is blank", "messages")
    return parsed


def _message_text(content: str | list[ContentPart] | None, role: str, param: str) -> str | Error:
    if content is None:
        # OpenAI lets only an assistant turn omit content (one with tool calls, refused above).
        return "" if role == "assistant" else invalid("content is required", param)
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type != "text":
            return invalid(f"content parts of type `{part.type}` are not supported yet", f"{param}[{i}].type")
        if part.text is None:
            return invalid("a text content part needs `text`", f"{param}[{i}].text")
        texts.append(part.text)
    return "\n".join(texts)  # as vLLM joins them, so prompts match across servers


def _completion_prompt(prompt: str | list[Any]) -> GenerateRequest | Error:
    if isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > 1:
            return invalid("batched prompts are not supported yet", "prompt")
        if prompt:
            prompt = prompt[0]  # a batch of one
    if not prompt:
        return invalid("the prompt is empty", "prompt")
    if isinstance(prompt, str):
        return GenerateRequest(text=prompt)
    try:
        return GenerateRequest(input_ids=msgspec.convert(prompt, list[TokenId]))
    except msgspec.ValidationError as exc:
        detail, _, index = str(exc).partition(" - at `$")
        return invalid(f"prompt must be a string or a list of token ids: {detail}", f"prompt{index.rstrip('`')}")


def _openai_parsed(
    kind: Literal["chat", "completion"], req: OpenAIFields, prompt: GenerateRequest, max_tokens: int | None, model: str
) -> ParsedRequest | Error:
    session = session_turn(req.session_id, req.session_parent, req.session_replace)
    if isinstance(session, Error):
        return session
    stream = bool(req.stream)
    request = msgspec.structs.replace(
        prompt, params=sampling_params(req, max_tokens), stream=stream, model=model, n=req.n or 1, session=session
    )
    include_usage = stream and req.stream_options is not None and bool(req.stream_options.include_usage)
    return ParsedRequest(kind, request, include_usage, req.user or "")
