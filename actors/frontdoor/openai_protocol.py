"""OpenAI and native request bodies in, our `GenerateRequest` out: the HTTP edge's validation.

Pure functions with no I/O, so the HTTP handlers stay thin. A body either becomes a
`ParsedRequest` or an `Error` that names the field at fault; a field we cannot honour is
refused rather than ignored, so a client never gets output it did not ask for.
The response builders live in `openai_responses` and are re-exported here for the handlers.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

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
from schemas.errors import Error
from schemas.generate import MAX_CHOICES, ChatMessage, GenerateRequest, SamplingParams, SessionTurn
from schemas.session import IdleTimeout, TokenCount as SessionTokens

# Bounds keep every number encodable downstream (msgpack, int32 tensors); msgspec alone takes any int.
INT32_MAX = 2**31 - 1
MAX_STOP_STRINGS = 16
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
Body = TypeVar("Body", bound=msgspec.Struct)

TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
TokenCount = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
StopString = Annotated[str, msgspec.Meta(min_length=1)]
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
# A turn is named by its request id; the id of an OpenAI response is that with a prefix.
RESPONSE_ID_PREFIXES = ("chatcmpl-", "cmpl-")
Stop = StopString | Annotated[list[StopString], msgspec.Meta(max_length=MAX_STOP_STRINGS)] | None


class SamplingFields(msgspec.Struct, kw_only=True):
    """What every route accepts for sampling; None means "the default"."""

    max_tokens: TokenCount | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | None = None  # -1 or 0: off
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None  # 0: off
    seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None  # int64
    stop: Stop = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None


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


class NativeSampling(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    max_new_tokens: TokenCount | None = None  # SGLang's name for max_tokens


class GenerateBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The native `/generate` body. Our own API, so an unknown field is a mistake worth naming."""

    text: str | None = None
    input_ids: list[TokenId] | None = None
    sampling_params: NativeSampling = msgspec.field(default_factory=NativeSampling)
    stream: bool = False
    session_id: Id | None = None  # as in OpenAIFields
    session_parent: Id | None = None
    session_replace: bool = False


class PublishBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`POST /admin/publish`: a prefix every tenant may read from the cache."""

    text: str | None = None
    input_ids: list[TokenId] | None = None


def parse_publish_request(body: bytes) -> GenerateRequest | Error:
    """The prefix as a prompt to encode (text is encoded as a completions prompt is)."""
    req = _decode(body, PublishBody)
    if isinstance(req, Error):
        return req
    error = _check_text_or_ids(req.text, req.input_ids, "prefix")
    if error:
        return error
    return GenerateRequest(text=req.text, input_ids=req.input_ids)


def _check_text_or_ids(text: str | None, input_ids: list[int] | None, what: str) -> Error | None:
    """The native bodies give their tokens as text or as ids: exactly one, and not empty."""
    if (text is None) == (input_ids is None):
        return _invalid("give exactly one of text and input_ids", "text")
    if not (text or input_ids):
        return _invalid(f"the {what} is empty", "text" if text is not None else "input_ids")
    return None


class SessionBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /v1/sessions, all of it optional."""

    capacity_tokens: SessionTokens | None = None  # most KV tokens kept pinned for it; default: the global budget
    idle_timeout_s: IdleTimeout | None = None  # it closes itself after this long unused; default: 600
    user: str | None = None  # as in completions: the tenant without API keys, a narrower scope with them


@dataclass(frozen=True)
class ParsedRequest:
    """A valid request. For chat without max_tokens, `request.params.max_tokens` is None: the
    scheduler fills in what the context window leaves after the prompt."""

    kind: Literal["chat", "completion", "generate"]
    request: GenerateRequest
    include_usage_in_stream: bool  # stream_options.include_usage, and only when streaming
    user: str = ""  # the OpenAI `user` field: the prefix-cache namespace when no API keys are configured


def parse_session_body(body: bytes) -> SessionBody | Error:
    return _decode(body, SessionBody) if body.strip() else SessionBody()


def parse_chat_request(body: bytes, served_model: str) -> ParsedRequest | Error:
    req = _decode(body, ChatCompletionRequest)
    if isinstance(req, Error):
        return req
    error = _check_model(req.model, served_model) or _refuse_unsupported(_chat_unsupported(req))
    if error:
        return error
    messages = _chat_messages(req.messages)
    if isinstance(messages, Error):
        return messages
    if req.max_tokens is not None and req.max_completion_tokens not in (None, req.max_tokens):
        return _invalid("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    max_tokens = req.max_completion_tokens or req.max_tokens  # None: up to the context window
    return _openai_parsed("chat", req, GenerateRequest(messages=messages), max_tokens, served_model)


def parse_completion_request(body: bytes, served_model: str) -> ParsedRequest | Error:
    req = _decode(body, CompletionRequest)
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


def parse_generate_request(body: bytes) -> ParsedRequest | Error:
    req = _decode(body, GenerateBody)
    if isinstance(req, Error):
        return req
    error = _check_text_or_ids(req.text, req.input_ids, "prompt")
    if error:
        return error
    sampling = req.sampling_params
    if sampling.max_tokens is not None and sampling.max_new_tokens not in (None, sampling.max_tokens):
        return _invalid("give max_new_tokens or max_tokens, not both", "sampling_params.max_new_tokens")
    # The bus API's default, so one prompt behaves the same on either door.
    max_tokens = sampling.max_new_tokens or sampling.max_tokens or SamplingParams().max_tokens
    session = _session_turn(req.session_id, req.session_parent, req.session_replace)
    if isinstance(session, Error):
        return session
    request = GenerateRequest(
        text=req.text, input_ids=req.input_ids, params=_sampling_params(sampling, max_tokens), stream=req.stream,
        session=session,
    )
    return ParsedRequest("generate", request, include_usage_in_stream=False)


def _decode(body: bytes, struct_type: type[Body]) -> Body | Error:
    try:
        return msgspec.json.decode(body, type=struct_type)
    except msgspec.ValidationError as exc:
        return _validation_error(str(exc))
    except msgspec.DecodeError as exc:
        return _invalid(f"The request body is not valid JSON: {exc}")
    except RecursionError:
        return _invalid("The request body is nested too deeply")


def _validation_error(text: str) -> Error:
    """Rewrites msgspec's "Expected `int`, got `str` - at `$.max_tokens`" with the field as `param`."""
    detail, _, path = text.partition(" - at `$")
    path = path.rstrip("`").lstrip(".")
    for prefix, say in (
        ("Object missing required field `", "is required"),
        ("Object contains unknown field `", "is not a known field"),
    ):
        if detail.startswith(prefix):
            field = ".".join(filter(None, (path, detail.removeprefix(prefix).rstrip("`"))))
            return _invalid(f"`{field}` {say}", field)
    if not path:
        return _invalid(f"The request body must be a JSON object: {detail}")
    return _invalid(f"Invalid value for `{path}`: {detail}", path)


def _invalid(message: str, param: str | None = None) -> Error:
    return Error("invalid_request", message, param=param)


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
            return _invalid(f"{feature} is not supported yet", feature.split(" ")[0])
    return None


def _chat_messages(messages: list[OpenAIMessage]) -> list[ChatMessage] | Error:
    if not messages:
        return _invalid("messages must not be empty", "messages")
    parsed = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        role = "system" if message.role == "developer" else message.role  # OpenAI's newer name
        if role in ("tool", "function") or message.tool_calls:
            return _invalid("tool calls and tool messages are not supported yet", param)
        if role not in ("system", "user", "assistant"):
            return _invalid(f"unknown role `{message.role}`", f"{param}.role")
        content = _message_text(message.content, role, f"{param}.content")
        if isinstance(content, Error):
            return content
        parsed.append(ChatMessage(role, content))
    if not any(m.content for m in parsed):
        return _invalid("messages are empty: every content is blank", "messages")
    return parsed


def _message_text(content: str | list[ContentPart] | None, role: str, param: str) -> str | Error:
    if content is None:
        # OpenAI lets only an assistant turn omit content (one with tool calls, refused above).
        return "" if role == "assistant" else _invalid("content is required", param)
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type != "text":
            return _invalid(f"content parts of type `{part.type}` are not supported yet", f"{param}[{i}].type")
        if part.text is None:
            return _invalid("a text content part needs `text`", f"{param}[{i}].text")
        texts.append(part.text)
    return "\n".join(texts)  # as vLLM joins them, so prompts match across servers


def _completion_prompt(prompt: str | list[Any]) -> GenerateRequest | Error:
    if isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > 1:
            return _invalid("batched prompts are not supported yet", "prompt")
        if prompt:
            prompt = prompt[0]  # a batch of one
    if not prompt:
        return _invalid("the prompt is empty", "prompt")
    if isinstance(prompt, str):
        return GenerateRequest(text=prompt)
    try:
        return GenerateRequest(input_ids=msgspec.convert(prompt, list[TokenId]))
    except msgspec.ValidationError as exc:
        detail, _, index = str(exc).partition(" - at `$")
        return _invalid(f"prompt must be a string or a list of token ids: {detail}", f"prompt{index.rstrip('`')}")


def _session_turn(session_id: str | None, parent: str | None, replace: bool | None) -> SessionTurn | None | Error:
    if session_id is None:
        if parent is not None or replace:
            return _invalid("session_parent and session_replace need a session_id", "session_id")
        return None
    if parent is not None:
        parent = next((parent.removeprefix(p) for p in RESPONSE_ID_PREFIXES if parent.startswith(p)), parent)
    return SessionTurn(session_id, parent, bool(replace))


def _openai_parsed(
    kind: Literal["chat", "completion"], req: OpenAIFields, prompt: GenerateRequest, max_tokens: int | None, model: str
) -> ParsedRequest | Error:
    session = _session_turn(req.session_id, req.session_parent, req.session_replace)
    if isinstance(session, Error):
        return session
    stream = bool(req.stream)
    request = msgspec.structs.replace(prompt, params=_sampling_params(req, max_tokens), stream=stream, model=model,
                                      n=req.n or 1, session=session)
    include_usage = stream and req.stream_options is not None and bool(req.stream_options.include_usage)
    return ParsedRequest(kind, request, include_usage, req.user or "")


def _sampling_params(fields: SamplingFields, max_tokens: int | None) -> SamplingParams:
    """Ranges were checked while decoding; here an absent or null field takes our default."""
    default = SamplingParams()

    def given(value, fallback):
        return fallback if value is None else value

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=given(fields.temperature, default.temperature),
        top_p=given(fields.top_p, default.top_p),
        top_k=given(fields.top_k, default.top_k),
        min_p=given(fields.min_p, default.min_p),
        seed=fields.seed,
        stop=[fields.stop] if isinstance(fields.stop, str) else given(fields.stop, []),
        stop_token_ids=given(fields.stop_token_ids, []),
        ignore_eos=given(fields.ignore_eos, default.ignore_eos),
        skip_special_tokens=given(fields.skip_special_tokens, default.skip_special_tokens),
    )
