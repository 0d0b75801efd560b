"""Anthropic's Messages API in (`POST /v1/messages`): the body translated into a chat completions
body (chat_translation.py), so it takes the chat path whole. The reply's shapes are in
anthropic_output.py.

No I/O. `tool_use` blocks become an assistant's tool calls, `tool_result` blocks tool messages
(before the user's own text of the same turn); earlier `thinking` blocks are dropped, as chat
templates drop earlier thinking. `thinking` switches the template's `enable_thinking`; its
`budget_tokens` is not enforced.
"""

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.chat_format import ChatFormat
from actors.frontdoor.chat_translation import ParamMap, convert, onto_chat
from actors.frontdoor.openai_protocol import ParsedRequest
from actors.frontdoor.request_fields import decode_body, invalid
from schemas.errors import Error

MaxTokens = Annotated[int, msgspec.Meta(ge=1)]


class TextBlock(msgspec.Struct):
    text: str


class ToolUseBlock(msgspec.Struct):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(msgspec.Struct):
    tool_use_id: str
    content: str | list[dict[str, Any]] = ""
    is_error: bool = False


class Message(msgspec.Struct):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class Tool(msgspec.Struct):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: str | None = None  # "custom" or absent; Anthropic's own tools are refused


class ToolChoice(msgspec.Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class Metadata(msgspec.Struct):
    user_id: str | None = None


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: MaxTokens
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    thinking: Thinking | None = None
    metadata: Metadata | None = None


@dataclass(frozen=True)
class MessagesParsed:
    chat: ParsedRequest
    stop_sequences: list[str]  # a stop string met among them ends with stop_reason "stop_sequence"


def parse_messages_request(body: bytes, served_model: str, chat_format: ChatFormat) -> MessagesParsed | Error:
    req = decode_body(body, MessagesRequest)
    if isinstance(req, Error):
        return req
    params = ParamMap(
        fields={"stop": "stop_sequences", "user": "metadata.user_id"},
        message_fields={"tool_call_id": "tool_use_id", "tool_calls": "content"},
    )
    messages = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "\n".join(block.text for block in req.system)
        messages.append({"role": "system", "content": system})
        params.messages.append("system")
    if not req.messages:
        return invalid("messages must not be empty", "messages")
    for i, message in enumerate(req.messages):
        turn = _turn(message, f"messages[{i}]")
        if isinstance(turn, Error):
            return turn
        messages += [chat for chat, _ in turn]
        params.messages += [where for _, where in turn]
    tools = []
    for i, tool in enumerate(req.tools or []):
        if tool.type not in (None, "custom"):
            return invalid(f"tools of type `{tool.type}` are not supported: only custom tools", f"tools[{i}].type")
        function = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    params.tool_fields = {"parameters": "input_schema"}
    chat: dict[str, Any] = {"messages": messages, "model": req.model, "max_tokens": req.max_tokens}
    chat["stream"] = bool(req.stream)
    if tools:
        chat["tools"] = tools
    if req.tool_choice is not None:
        chat |= _tool_choice(req.tool_choice)
    optional = {
        "stop": req.stop_sequences,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "user": req.metadata.user_id if req.metadata else None,
    }
    chat |= {key: value for key, value in optional.items() if value is not None}
    if req.thinking is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": req.thinking.type != "disabled"}
    parsed = onto_chat(chat, served_model, chat_format, params)
    if isinstance(parsed, Error):
        return parsed
    return MessagesParsed(parsed, req.stop_sequences or [])


def _turn(message: Message, param: str) -> list[tuple[dict, str]] | Error:
    """One Anthropic message as chat messages, each with the field it came from: an assistant's
    text and calls in one message; a user's tool results as tool messages, then the user's text."""
    if isinstance(message.content, str):
        return [({"role": message.role, "content": message.content}, param)]
    texts, calls, results = [], [], []
    for j, raw in enumerate(message.content):
        where = f"{param}.content[{j}]"
        kind = raw.get("type")
        if kind == "text":
            block = convert(raw, TextBlock, where)
            if isinstance(block, Error):
                return block
            texts.append(block.text)
        elif kind == "tool_use" and message.role == "assistant":
            block = convert(raw, ToolUseBlock, where)
            if isinstance(block, Error):
                return block
            function = {"name": block.name, "arguments": json.dumps(block.input)}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif kind == "tool_result" and message.role == "user":
            block = convert(raw, ToolResultBlock, where)
            if isinstance(block, Error):
                return block
            content = _result_text(block.content, f"{where}.content")
            if isinstance(content, Error):
                return content
            results.append(({"role": "tool", "tool_call_id": block.tool_use_id, "content": content}, where))
        elif kind in ("thinking", "redacted_thinking") and message.role == "assistant":
            continue
        else:
            return invalid(f"a {message.role}'s content blocks of type `{kind}` are not supported", f"{where}.type")
    if message.role == "assistant":
        chat = {"role": "assistant", "content": "\n".join(texts) or None} | ({"tool_calls": calls} if calls else {})
        return [(chat, param)]
    return results + ([({"role": "user", "content": "\n".join(texts)}, param)] if texts or not results else [])


def _result_text(content: str | list[dict[str, Any]], param: str) -> str | Error:
    if isinstance(content, str):
        return content
    texts = []
    for k, raw in enumerate(content):
        if raw.get("type") != "text":
            return invalid(f"tool results of type `{raw.get('type')}` are not supported yet", f"{param}[{k}].type")
        block = convert(raw, TextBlock, f"{param}[{k}]")
        if isinstance(block, Error):
            return block
        texts.append(block.text)
    return "\n".join(texts)


def _tool_choice(choice: ToolChoice) -> dict:
    parallel = {"parallel_tool_calls": False} if choice.disable_parallel_tool_use else {}
    if choice.type == "tool":
        named = {"type": "function", "function": {"name": choice.name or ""}}
        return {"tool_choice": named} | parallel
    return {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}[choice.type]} | parallel
