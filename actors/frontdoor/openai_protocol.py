"""OpenAI's chat and completions bodies in, our `GenerateRequest` out: the HTTP edge's validation.

Pure functions with no I/O, so the HTTP handlers stay thin. A body either becomes a
`ParsedRequest` or an `Error` that names the field at fault. The rule (request_fields.py): every
field declared here is honoured, or accepted with no effect where it carries no meaning for
generation (`metadata`, `store: false`, `service_tier`, each marked so), and any other field is
refused with 400 naming it, OpenAI's own fields this server does not implement among them
(`suffix`, `functions`, `audio`, ...). vLLM's extras are honoured too (its sampling controls,
`prompt_logprobs`, `return_token_ids`, `cache_salt`). A chat's messages are read by
`chat_messages`, its tool and reasoning fields by `chat_tools`. SGLang's native bodies are in
`sglang_protocol`; the response builders live in `openai_responses`.
"""

from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.chat_messages import OpenAIMessage, chat_messages
from actors.frontdoor.chat_tools import HTTP_PARAMS, TemplateKwargs, chat_tools
from actors.frontdoor.request_fields import (
    TOKEN_ID_SCHEMA,
    WINDOW,
    Id,
    SamplingFields,
    beyond_schema,
    decode_body,
    integral,
    invalid,
    sampling_params,
    session_turn,
)
from actors.lib.chat_format import ChatFormat
from actors.lib.chat_reply import ReplyOptions
from actors.lib.chat_tools import FunctionTool
from actors.lib.tool_calls.constraint import ToolCallConstraint
from schemas.errors import Error
from schemas.generate import MAX_CHOICES, GenerateRequest, TokenCount, TokenId, ToolChoice, TopLogprobs

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class OutputOptions:
    """What the response shows beyond the text, as the client asked."""

    logprobs: int | None = None  # the top alternatives per token (0: the chosen token's alone); None: no logprobs
    echo: bool = False  # completions: the prompt before the output (with its logprobs when asked)
    prompt_logprobs: int | None = None  # vLLM's: top alternatives per prompt token; None: none
    return_token_ids: bool = False  # vLLM's: `prompt_token_ids` and each choice's `token_ids`
    tokens_as_ids: bool = False  # vLLM's `return_tokens_as_token_ids`: tokens named `token_id:<id>`


@dataclass(frozen=True)
class ParsedRequest:
    """A valid request. For chat without max_tokens, `request.params.max_tokens` is None: the
    scheduler fills in what the context window leaves after the prompt."""

    kind: Literal["chat", "completion"]
    request: GenerateRequest
    include_usage_in_stream: bool  # stream_options.include_usage, and only when streaming
    user: str = ""  # the OpenAI `user` field: the tenant when no API keys are configured
    output: OutputOptions = field(default_factory=OutputOptions)
    reply: ReplyOptions = field(default_factory=ReplyOptions)  # chat: how its replies are read
    # Chat with tool_choice required or a named function: the grammar its replies must follow.
    tool_constraint: ToolCallConstraint | None = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None


class OpenAIFields(SamplingFields, kw_only=True):
    """Fields shared by chat and completions (unknown ones are refused, as SamplingFields says)."""

    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Annotated[Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)] | None, beyond_schema("1 with session_id")] = None
    user: str | None = None  # names the tenant when no API keys are configured
    # A turn of a session (POST /v1/sessions): the prompt continues the parent turn's conversation.
    session_id: Annotated[Id | None, beyond_schema("given with session_parent or session_replace")] = None
    session_parent: Id | None = None  # the id of the turn to continue; default: the latest
    session_replace: bool | None = None  # drop the turns after the parent once this one is done
    # vLLM's: prefixes are cached apart from other salts'
    cache_salt: Annotated[str | None, beyond_schema("not with session_id: a session reads its own prefix")] = None
    prompt_logprobs: Annotated[TopLogprobs | None, beyond_schema("not with stream")] = None  # vLLM's
    return_token_ids: bool | None = None  # vLLM's
    return_tokens_as_token_ids: bool | None = None  # vLLM's
    # Logprobs of the raw logits (the default), or of the distribution drawn from: the values of
    # vLLM's --logprobs-mode, per request here.
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] | None = None


# The conversation is the chat template's to render, which may refuse one (a role order it does not
# take): its 400 names `messages`.
Messages = Annotated[
    list[OpenAIMessage],
    msgspec.Meta(min_length=1),
    beyond_schema("rendered by the model's chat template; a tool message answers an earlier call's id"),
]


class ChatCompletionRequest(OpenAIFields, kw_only=True):
    messages: Messages
    max_completion_tokens: Annotated[
        TokenCount | None, beyond_schema(f"the newer name of max_tokens: given both, they agree; {WINDOW}")
    ] = None
    logprobs: bool | None = None
    top_logprobs: Annotated[TopLogprobs | None, beyond_schema("more than 0 needs logprobs true")] = None
    tools: Annotated[
        list[FunctionTool] | None,
        beyond_schema("names differ; a demanded call's parameters are a schema a grammar follows"),
    ] = None
    tool_choice: Annotated[
        ToolChoice | None,
        beyond_schema("required or a name needs tools, and no structured output; a name is one of tools"),
    ] = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: TemplateKwargs | None = None  # the template's own variables, e.g. enable_thinking
    include_reasoning: bool | None = None  # vLLM's: False leaves reasoning_content out
    separate_reasoning: bool | None = None  # SGLang's: False leaves the thinking in content
    # Accepted with no effect: they carry no meaning for generation. OpenAI keeps `metadata` with a
    # stored completion, and nothing is stored here (so `store: true` is refused); one server has
    # one service tier.
    metadata: dict[str, str] | None = None
    store: Literal[False] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None


_PROMPT_TEXT = {"type": "string", "minLength": 1}
_PROMPT_IDS = {"type": "array", "items": TOKEN_ID_SCHEMA, "minItems": 1}
# str, [str], [int] or [[int]], a batch of one at most; msgspec cannot tell two array types apart in
# one union, so `_completion_prompt` checks the lists, and the document says what it takes.
Prompt = (
    Annotated[str, msgspec.Meta(min_length=1)]
    | Annotated[
        list[Any],
        msgspec.Meta(
            min_length=1,
            extra_json_schema={
                "anyOf": [
                    {"items": _PROMPT_TEXT, "maxItems": 1},
                    _PROMPT_IDS,
                    {"items": _PROMPT_IDS, "maxItems": 1},
                ]
            },
        ),
    ]
)


class CompletionRequest(OpenAIFields, kw_only=True):
    prompt: Prompt
    echo: bool | None = None
    logprobs: TopLogprobs | None = None  # even 0 asks for the chosen token's logprob


def parse_chat_request(body: bytes, served_model: str, chat_format: ChatFormat = ChatFormat()) -> ParsedRequest | Error:
    """`chat_format`: what the served model writes beside its answer (tool calls, thinking)."""
    req = decode_body(body, ChatCompletionRequest)
    if isinstance(req, Error):
        return req
    if error := _check_model(req.model, served_model):
        return error
    messages = chat_messages(req.messages)
    if isinstance(messages, Error):
        return messages
    tools = chat_tools(req, chat_format)
    if isinstance(tools, Error):
        return tools
    if req.max_tokens is not None and req.max_completion_tokens not in (None, req.max_tokens):
        return invalid("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    max_tokens = req.max_completion_tokens or req.max_tokens  # None: up to the context window
    if req.top_logprobs and not req.logprobs:
        return invalid("top_logprobs needs logprobs set to true", "top_logprobs")
    output = OutputOptions(logprobs=(req.top_logprobs or 0) if req.logprobs else None)
    parsed = _openai_parsed("chat", req, GenerateRequest(messages=messages), max_tokens, served_model, output)
    if isinstance(parsed, Error):
        return parsed
    request = tools.applied(parsed.request, HTTP_PARAMS)
    if isinstance(request, Error):
        return request
    return replace(parsed, request=request, reply=tools.reply, tool_constraint=tools.constraint)


def parse_completion_request(body: bytes, served_model: str) -> ParsedRequest | Error:
    req = decode_body(body, CompletionRequest)
    if isinstance(req, Error):
        return req
    if error := _check_model(req.model, served_model):
        return error
    prompt = _completion_prompt(req.prompt)
    if isinstance(prompt, Error):
        return prompt
    max_tokens = req.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS
    output = OutputOptions(logprobs=req.logprobs, echo=bool(req.echo))
    return _openai_parsed("completion", req, prompt, max_tokens, served_model, output)


def _check_model(model: str | None, served_model: str) -> Error | None:
    # OpenAI requires `model`; we take a missing one to mean the model we serve.
    if model is not None and model != served_model:
        return Error("not_found", f"The model `{model}` does not exist.", param="model")
    return None


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
        return GenerateRequest(input_ids=msgspec.convert(integral(prompt), list[TokenId]))
    except msgspec.ValidationError as exc:
        detail, _, index = str(exc).partition(" - at `$")
        return invalid(f"prompt must be a string or a list of token ids: {detail}", f"prompt{index.rstrip('`')}")


def _openai_parsed(
    kind: Literal["chat", "completion"],
    req: OpenAIFields,
    prompt: GenerateRequest,
    max_tokens: int | None,
    model: str,
    output: OutputOptions,
) -> ParsedRequest | Error:
    session = session_turn(req.session_id, req.session_parent, req.session_replace)
    if isinstance(session, Error):
        return session
    stream = bool(req.stream)
    if stream and req.prompt_logprobs is not None:
        return invalid("prompt_logprobs are not available when streaming", "prompt_logprobs")
    params = sampling_params(req, max_tokens)
    if isinstance(params, Error):
        return params
    output = replace(
        output,
        prompt_logprobs=req.prompt_logprobs,
        return_token_ids=bool(req.return_token_ids),
        tokens_as_ids=bool(req.return_tokens_as_token_ids),
    )
    # The prompt's logprobs are computed from its second token on, for vLLM's `prompt_logprobs` or
    # for an echoed prompt with logprobs; one top_logprobs serves the prompt and the output. An
    # echoed prompt of token ids is scored too: the text of its tokens comes with their logprobs.
    echoes_ids = output.echo and prompt.text is None
    scores_prompt = output.prompt_logprobs is not None or (output.echo and output.logprobs is not None) or echoes_ids
    params = msgspec.structs.replace(
        params,
        logprobs=output.logprobs is not None,
        top_logprobs=max(output.logprobs or 0, output.prompt_logprobs or 0),
        prompt_logprobs_from=0 if scores_prompt else None,
        processed_logprobs=req.logprobs_mode == "processed_logprobs",
    )
    request = msgspec.structs.replace(
        prompt,
        params=params,
        stream=stream,
        model=model,
        n=req.n or 1,
        session=session,
        cache_salt=req.cache_salt or "",
    )
    include_usage = stream and req.stream_options is not None and bool(req.stream_options.include_usage)
    return ParsedRequest(kind, request, include_usage, req.user or "", output)
