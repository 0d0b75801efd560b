"""Anthropic's Messages API in (`POST /v1/messages`): the body translated into a chat completions
body (chat_translation.py), so it takes the chat path whole. The reply's shapes are in
anthropic_output.py.

No I/O. The body follows the rule of every route (request_fields.py): a field is honoured, accepted
with no effect where marked so, or refused naming it. Blocks are Structs tagged by `type` and
messages by `role`, so a block a role cannot send (a user's `tool_use`, images, documents) is
refused by the decoder. `tool_use` blocks become an assistant's tool calls, `tool_result` blocks
tool messages (before the user's own text of the same turn); earlier `thinking` blocks are dropped,
as chat templates drop earlier thinking. `thinking` switches the template's `enable_thinking`.
"""

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.chat_translation import ParamMap, onto_chat
from actors.frontdoor.openai_protocol import ParsedRequest
from actors.frontdoor.request_fields import WINDOW, beyond_schema, decode_body
from actors.lib.chat_format import ChatFormat
from schemas.errors import Error
from schemas.generate import StopStrings, Temperature, TopK, TopP

MaxTokens = Annotated[int, msgspec.Meta(ge=1)]


class CacheControl(msgspec.Struct, forbid_unknown_fields=True):
    """Anthropic's prompt-caching breakpoint: accepted with no effect, as every prefix is cached
    here without being asked (the prefix cache)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str
    cache_control: CacheControl | None = None  # no effect


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use", forbid_unknown_fields=True):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None  # no effect


class ResultText(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None  # no effect


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result", forbid_unknown_fields=True):
    tool_use_id: str
    content: str | list[ResultText] = ""
    # No effect: a chat template has no place for it; the result's own text says what failed.
    is_error: bool = False
    cache_control: CacheControl | None = None  # no effect


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking", forbid_unknown_fields=True):
    """An earlier reply's thinking: dropped, as chat templates drop earlier thinking."""

    thinking: str
    signature: str = ""


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking", forbid_unknown_fields=True):
    """Dropped, as thinking blocks are."""

    data: str


class SystemText(msgspec.Struct, forbid_unknown_fields=True):
    """A text block of `system`: alone in its list, so its `type` is a field (msgspec checks the
    tag of a lone tagged Struct only when given)."""

    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None  # no effect


class UserMessage(msgspec.Struct, tag_field="role", tag="user", forbid_unknown_fields=True):
    content: str | list[TextBlock | ToolResultBlock]


class AssistantMessage(msgspec.Struct, tag_field="role", tag="assistant", forbid_unknown_fields=True):
    content: str | list[TextBlock | ToolUseBlock | ThinkingBlock | RedactedThinkingBlock]


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    """A client tool; Anthropic's own server tools (`bash_...`, `web_search_...`) are not run here."""

    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None  # no effect


class AutoChoice(msgspec.Struct, tag_field="type", tag="auto", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool | None = None


class AnyChoice(msgspec.Struct, tag_field="type", tag="any", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool | None = None


class ToolNamed(msgspec.Struct, tag_field="type", tag="tool", forbid_unknown_fields=True):
    name: str
    disable_parallel_tool_use: bool | None = None


class NoneChoice(msgspec.Struct, tag_field="type", tag="none", forbid_unknown_fields=True):
    pass


ToolChoice = AutoChoice | AnyChoice | ToolNamed | NoneChoice


class ThinkingEnabled(msgspec.Struct, tag_field="type", tag="enabled", forbid_unknown_fields=True):
    """Anthropic requires `budget_tokens` here; it bounds nothing on this server, so the server
    refuses it (`NOT_IMPLEMENTED`): send `{"type": "adaptive"}`, which needs none."""


class ThinkingAdaptive(msgspec.Struct, tag_field="type", tag="adaptive", forbid_unknown_fields=True):
    pass


class ThinkingDisabled(msgspec.Struct, tag_field="type", tag="disabled", forbid_unknown_fields=True):
    pass


class Metadata(msgspec.Struct, forbid_unknown_fields=True):
    user_id: str | None = None  # the chat route's `user`


class MessagesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    max_tokens: Annotated[MaxTokens, beyond_schema(WINDOW)]
    messages: Annotated[
        list[UserMessage | AssistantMessage],
        msgspec.Meta(min_length=1),
        beyond_schema("rendered by the model's chat template; a tool_result answers an earlier tool_use's id"),
    ]
    system: str | list[SystemText] | None = None
    tools: Annotated[
        list[Tool] | None, beyond_schema("names differ; a demanded call's input_schema is a schema a grammar follows")
    ] = None
    tool_choice: Annotated[
        ToolChoice | None, beyond_schema("any or a named tool needs tools; a name is one of them")
    ] = None
    stop_sequences: StopStrings | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stream: bool | None = None
    thinking: ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled | None = None
    metadata: Metadata | None = None
    # No effect: one server has one service tier.
    service_tier: Literal["auto", "standard_only"] | None = None


@dataclass(frozen=True)
class MessagesParsed:
    chat: ParsedRequest
    stop_sequences: list[str]  # a stop string met among them ends with stop_reason "stop_sequence"
    params: ParamMap  # the client's fields of the chat path's


def parse_messages_request(body: bytes, served_model: str, chat_format: ChatFormat) -> MessagesParsed | Error:
    req = decode_body(body, MessagesRequest)
    if isinstance(req, Error):
        return req
    params = ParamMap(
        # `prompt`: a downstream error's name for the conversation (too long for the context window).
        fields={"stop": "stop_sequences", "user": "metadata.user_id", "prompt": "messages"},
        message_fields={"tool_call_id": "tool_use_id", "tool_calls": "content"},
    )
    messages = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "\n".join(block.text for block in req.system)
        messages.append({"role": "system", "content": system})
        params.messages.append("system")
    for i, message in enumerate(req.messages):
        turn = _turn(message, f"messages[{i}]")
        messages += [chat for chat, _ in turn]
        params.messages += [where for _, where in turn]
    tools = []
    for tool in req.tools or []:
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
        chat["chat_template_kwargs"] = {"enable_thinking": not isinstance(req.thinking, ThinkingDisabled)}
    parsed = onto_chat(chat, served_model, chat_format, params)
    if isinstance(parsed, Error):
        return parsed
    return MessagesParsed(parsed, req.stop_sequences or [], params)


def _turn(message: UserMessage | AssistantMessage, param: str) -> list[tuple[dict, str]]:
    """One Anthropic message as chat messages, each with the field it came from: an assistant's
    text and calls in one message; a user's tool results as tool messages, then the user's text."""
    role = "user" if isinstance(message, UserMessage) else "assistant"
    if isinstance(message.content, str):
        return [({"role": role, "content": message.content}, param)]
    texts, calls, results = [], [], []
    for j, block in enumerate(message.content):
        match block:
            case TextBlock():
                texts.append(block.text)
            case ToolUseBlock():
                function = {"name": block.name, "arguments": json.dumps(block.input)}
                calls.append({"id": block.id, "type": "function", "function": function})
            case ToolResultBlock():
                content = block.content if isinstance(block.content, str) else "\n".join(t.text for t in block.content)
                chat = {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
                results.append((chat, f"{param}.content[{j}]"))
    if role == "assistant":
        chat = {"role": "assistant", "content": "\n".join(texts) or None} | ({"tool_calls": calls} if calls else {})
        return [(chat, param)]
    return results + ([({"role": "user", "content": "\n".join(texts)}, param)] if texts or not results else [])


def _tool_choice(choice: ToolChoice) -> dict:
    match choice:
        case NoneChoice():
            return {"tool_choice": "none"}
        case ToolNamed():
            asked: str | dict = {"type": "function", "function": {"name": choice.name}}
        case AnyChoice():
            asked = "required"
        case AutoChoice():
            asked = "auto"
    parallel = {"parallel_tool_calls": False} if choice.disable_parallel_tool_use else {}
    return {"tool_choice": asked} | parallel
