"""OpenAI's Responses API in (`POST /v1/responses`), stateless: the body translated into a chat
completions body (chat_translation.py), so it takes the chat path whole. The reply's shapes are in
responses_output.py.

No I/O. The rule of every body (request_fields.py) holds: a field is honoured, accepted with no
effect where marked so, or refused naming it. Nothing is stored: `store: true`, `background: true`
and `previous_response_id` are refused, and the reply says `"store": false`. `reasoning.effort`
switches the template's `enable_thinking` ("none" and "minimal" off, the others on); the thinking
is read out of the reply only where the server runs a reasoning parser. `text.format` is the chat
route's `response_format`. An earlier response's output items may come back as input: their ids,
statuses and annotations mean nothing for the next reply, and its reasoning items are dropped, as
chat templates drop earlier thinking.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.chat_translation import ParamMap, convert, onto_chat
from actors.frontdoor.openai_protocol import ParsedRequest
from actors.frontdoor.request_fields import COMPONENT_REF, GRAMMAR, WINDOW, beyond_schema, decode_body, invalid
from actors.frontdoor.structured_output import JsonSchema
from actors.lib.chat_format import ChatFormat
from schemas.errors import Error
from schemas.generate import Temperature, TokenCount, TopP

_THINKING_OFF = ("none", "minimal")
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class Reasoning(msgspec.Struct, forbid_unknown_fields=True):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: None = None  # null alone: the thinking is given whole, never summarised


class PlainText(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    pass


class JsonObjectText(msgspec.Struct, tag_field="type", tag="json_object", forbid_unknown_fields=True):
    pass


class JsonSchemaText(
    msgspec.Struct, kw_only=True, tag_field="type", tag="json_schema", forbid_unknown_fields=True, omit_defaults=True
):
    """The chat route's `response_format.json_schema`, flattened as the Responses API gives it."""

    name: str | None = None
    schema: JsonSchema
    description: str | None = None
    strict: bool | None = None


class TextOptions(msgspec.Struct, forbid_unknown_fields=True):
    format: PlainText | JsonObjectText | JsonSchemaText | None = None


class FunctionChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    name: str


class ResponsesTool(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A function tool; OpenAI's hosted tools (web search, file search, ...) are not run here."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # as on the chat route: a demanded call follows `parameters` whatever it says


class InputPart(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["input_text", "output_text", "text"]
    text: str
    # An earlier reply's: no effect (this server's replies carry none but empty lists).
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class MessageItem(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputPart]
    type: Literal["message"] = "message"
    id: str | None = None  # an earlier output item's: no effect
    status: ItemStatus | None = None  # likewise


class FunctionCallItem(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None  # no effect
    status: ItemStatus | None = None  # no effect


class FunctionCallOutputItem(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputPart]
    id: str | None = None  # no effect
    status: ItemStatus | None = None  # no effect


class ReasoningItem(msgspec.Struct, forbid_unknown_fields=True):
    """An earlier reply's thinking: dropped whole, as chat templates drop earlier thinking."""

    type: Literal["reasoning"]
    summary: list[dict[str, Any]]
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    id: str | None = None
    status: ItemStatus | None = None


ITEMS = {"message": MessageItem, "function_call": FunctionCallItem}
ITEMS |= {"function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}
# Items are read by their `type` (a message's may be left out), which no tagged union allows, so the
# document names the item Structs itself (openapi.py puts them among its components).
Item = Annotated[
    dict[str, Any],
    msgspec.Meta(
        extra_json_schema={"anyOf": [{"$ref": COMPONENT_REF.format(name=t.__name__)} for t in ITEMS.values()]}
    ),
]


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    input: Annotated[
        str | Annotated[list[Item], msgspec.Meta(min_length=1)],
        beyond_schema("rendered by the model's chat template; a function_call_output answers an earlier call_id"),
    ]
    instructions: str | None = None
    tools: Annotated[
        list[ResponsesTool] | None,
        beyond_schema("names differ; a demanded call's parameters are a schema a grammar follows"),
    ] = None
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | FunctionChoice | None,
        beyond_schema("required or a name needs tools, and no structured output; a name is one of tools"),
    ] = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[TokenCount | None, beyond_schema(WINDOW)] = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = None
    reasoning: Reasoning | None = None
    text: Annotated[TextOptions | None, beyond_schema(GRAMMAR)] = None
    user: str | None = None  # the chat route's: the tenant without API keys
    store: Literal[False] | None = None  # nothing is stored here
    background: Literal[False] | None = None  # nothing is kept to come back to
    truncation: Literal["disabled"] | None = None  # a conversation over the context window is refused
    # No effect: they carry no meaning for generation (OpenAI keeps `metadata` with a stored
    # response, and nothing is stored; one server has one service tier).
    metadata: dict[str, str] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None


@dataclass(frozen=True)
class ResponsesParsed:
    """A valid request on the chat path, and what its reply repeats of it."""

    chat: ParsedRequest
    echo: dict  # instructions, tools, tool_choice, ... as the response object shows them
    params: ParamMap  # the client's fields of the chat path's


def parse_responses_request(body: bytes, served_model: str, chat_format: ChatFormat) -> ResponsesParsed | Error:
    req = decode_body(body, ResponsesRequest)
    if isinstance(req, Error):
        return req
    params = ParamMap(
        # `prompt`: a downstream error's name for the conversation (too long for the context window).
        fields={"max_tokens": "max_output_tokens", "messages": "input", "prompt": "input"}
        | {"response_format.json_schema": "text.format", "response_format": "text.format"},
        message_fields={"tool_call_id": "call_id"},
    )
    messages = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
        params.messages.append("instructions")
    items = _input_messages(req.input, params)
    if isinstance(items, Error):
        return items
    messages += items
    params.tool_fields = {"parameters": "parameters", "name": "name"}
    chat = {"messages": messages, "stream": bool(req.stream), "model": req.model}
    optional = {
        "tools": [_function(tool) for tool in req.tools or []] or None,
        "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.user,
        "response_format": _response_format(req.text.format if req.text else None),
    }
    chat |= {key: value for key, value in optional.items() if value is not None}
    if req.reasoning is not None and req.reasoning.effort is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": req.reasoning.effort not in _THINKING_OFF}
    parsed = onto_chat(chat, served_model, chat_format, params)
    if isinstance(parsed, Error):
        return parsed
    echo = {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "text": {"format": msgspec.to_builtins(req.text.format) if req.text and req.text.format else {"type": "text"}},
        "tool_choice": msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
        "tools": msgspec.to_builtins(req.tools or []),
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "user": req.user,
        "metadata": req.metadata or {},
    }
    return ResponsesParsed(parsed, echo, params)


def _input_messages(given: str | list[dict[str, Any]], params: ParamMap) -> list[dict] | Error:
    """Input items as chat messages; a run of `function_call` items joins the assistant message
    before it, as one assistant turn makes several calls."""
    if isinstance(given, str):
        params.messages.append("input")
        return [{"role": "user", "content": given}]
    messages: list[dict] = []
    for i, raw in enumerate(given):
        param = f"input[{i}]"
        kind = raw.get("type", "message")
        if not isinstance(kind, str) or kind not in ITEMS:
            return invalid(f"input items of type `{kind}` are not supported", f"{param}.type")
        item = convert(raw, ITEMS[kind], param)
        match item:
            case Error():
                return item
            case MessageItem():
                messages.append({"role": item.role, "content": _text(item.content)})
            case FunctionCallItem():
                entry = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(entry)
                    continue
                messages.append({"role": "assistant", "content": None, "tool_calls": [entry]})
            case FunctionCallOutputItem():
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
            case ReasoningItem():
                continue  # earlier thinking: chat templates drop it from the history too
        params.messages.append(param)
    return messages


def _text(content: str | list[InputPart]) -> str:
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


def _function(tool: ResponsesTool) -> dict:
    function = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": tool.strict,
    }
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _tool_choice(choice: str | FunctionChoice | None) -> str | dict | None:
    if isinstance(choice, FunctionChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return choice  # "none", "auto", "required": checked on the chat path


def _response_format(given: PlainText | JsonObjectText | JsonSchemaText | None) -> dict | None:
    match given:
        case JsonObjectText():
            return {"type": "json_object"}
        case JsonSchemaText():
            fields = {
                "name": given.name,
                "schema": given.schema,
                "description": given.description,
                "strict": given.strict,
            }
            return {"type": "json_schema", "json_schema": {k: v for k, v in fields.items() if v is not None}}
    return None
