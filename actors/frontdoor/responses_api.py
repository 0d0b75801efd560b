"""OpenAI's Responses API in (`POST /v1/responses`), stateless: the body translated into a chat
completions body (chat_translation.py), so it takes the chat path whole. The reply's shapes are in
responses_output.py.

No I/O. Nothing is stored: `previous_response_id` is refused, and `store` is read and ignored (the
reply says `"store": false`). `reasoning.effort` switches the template's `enable_thinking`
("none" and "minimal" off, the others on); the thinking is read out of the reply only where the
server runs a reasoning parser.
"""

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from actors.frontdoor.chat_format import ChatFormat
from actors.frontdoor.chat_translation import ParamMap, convert, onto_chat
from actors.frontdoor.openai_protocol import ParsedRequest
from actors.frontdoor.request_fields import decode_body, invalid
from schemas.errors import Error
from schemas.generate import TokenCount

_THINKING_OFF = ("none", "minimal")


class Reasoning(msgspec.Struct):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: str | None = None  # accepted; the thinking is given whole, never summarised


class TextFormat(msgspec.Struct):
    type: str


class TextOptions(msgspec.Struct):
    format: TextFormat | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """The fields read; others (`metadata`, `include`, `truncation`, `service_tier`) are ignored."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: TokenCount | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    reasoning: Reasoning | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    background: bool | None = None
    text: TextOptions | None = None
    user: str | None = None


class InputPart(msgspec.Struct):
    type: str
    text: str | None = None


class MessageItem(msgspec.Struct):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputPart]


class FunctionCallItem(msgspec.Struct):
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(msgspec.Struct):
    call_id: str
    output: str | list[InputPart]


class ResponsesTool(msgspec.Struct):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@dataclass(frozen=True)
class ResponsesParsed:
    """A valid request on the chat path, and what its reply repeats of it."""

    chat: ParsedRequest
    echo: dict  # instructions, tools, tool_choice, ... as the response object shows them


def parse_responses_request(body: bytes, served_model: str, chat_format: ChatFormat) -> ResponsesParsed | Error:
    req = decode_body(body, ResponsesRequest)
    if isinstance(req, Error):
        return req
    if req.previous_response_id is not None:
        message = "this server keeps no responses: send the whole conversation in `input`"
        return invalid(message, "previous_response_id")
    if req.background:
        return invalid("background responses are not supported: this server keeps no responses", "background")
    if req.text and req.text.format and req.text.format.type != "text":
        return invalid(f"text.format `{req.text.format.type}` is not supported yet", "text.format.type")
    params = ParamMap(
        fields={"max_tokens": "max_output_tokens", "messages": "input"}, message_fields={"tool_call_id": "call_id"}
    )
    messages = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
        params.messages.append("instructions")
    items = _input_messages(req.input, params)
    if isinstance(items, Error):
        return items
    messages += items
    tools = _tools(req.tools or [])
    if isinstance(tools, Error):
        return tools
    params.tool_fields = {"parameters": "parameters", "name": "name"}
    chat = {"messages": messages, "stream": bool(req.stream), "model": req.model}
    choice = _tool_choice(req.tool_choice)
    if isinstance(choice, Error):
        return choice
    optional = {
        "tools": tools or None,
        "tool_choice": choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.user,
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
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "user": req.user,
    }
    return ResponsesParsed(parsed, echo)


def _input_messages(given: str | list[dict[str, Any]], params: ParamMap) -> list[dict] | Error:
    """Input items as chat messages; a run of `function_call` items joins the assistant message
    before it, as one assistant turn makes several calls."""
    if isinstance(given, str):
        params.messages.append("input")
        return [{"role": "user", "content": given}]
    if not given:
        return invalid("input must not be empty", "input")
    messages: list[dict] = []
    for i, item in enumerate(given):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            message = convert(item, MessageItem, param)
            if isinstance(message, Error):
                return message
            content = _text(message.content, f"{param}.content")
            if isinstance(content, Error):
                return content
            messages.append({"role": message.role, "content": content})
        elif kind == "function_call":
            call = convert(item, FunctionCallItem, param)
            if isinstance(call, Error):
                return call
            entry = {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(entry)
                continue
            messages.append({"role": "assistant", "content": None, "tool_calls": [entry]})
        elif kind == "function_call_output":
            result = convert(item, FunctionCallOutputItem, param)
            if isinstance(result, Error):
                return result
            output = _text(result.output, f"{param}.output")
            if isinstance(output, Error):
                return output
            messages.append({"role": "tool", "tool_call_id": result.call_id, "content": output})
        elif kind == "reasoning":
            continue  # earlier thinking: chat templates drop it from the history too
        else:
            return invalid(f"input items of type `{kind}` are not supported", f"{param}.type")
        params.messages.append(param)
    return messages


def _text(content: str | list[InputPart], param: str) -> str | Error:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text"):
            return invalid(f"content parts of type `{part.type}` are not supported yet", f"{param}[{j}].type")
        if part.text is None:
            return invalid("a text part needs `text`", f"{param}[{j}].text")
        texts.append(part.text)
    return "\n".join(texts)


def _tools(given: list[dict[str, Any]]) -> list[dict] | Error:
    tools = []
    for i, raw in enumerate(given):
        tool = convert(raw, ResponsesTool, f"tools[{i}]")
        if isinstance(tool, Error):
            return tool
        if tool.type != "function":
            return invalid(f"tools of type `{tool.type}` are not supported: only function tools", f"tools[{i}].type")
        if tool.name is None:
            return invalid("a function tool needs `name`", f"tools[{i}].name")
        function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
        tools.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return tools


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict | None | Error:
    if choice is None or isinstance(choice, str):
        return choice  # "none", "auto", "required": checked on the chat path
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return invalid("tool_choice must be none, auto, required or {type: function, name}", "tool_choice")
