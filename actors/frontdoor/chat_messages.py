"""OpenAI's chat messages in, the conversation the tokenizer renders out (`ChatMessage`s): text
content, an assistant's tool calls and the tool results that answer them.

No I/O. A message the template could not render faithfully is refused with the field named:
content parts other than text, a tool result that answers no earlier call, arguments that are not
JSON (templates read them decoded, as vLLM hands them over).
"""

import json

import msgspec

from actors.frontdoor.request_fields import invalid
from schemas.errors import Error
from schemas.generate import ChatMessage, ChatToolCall, ToolCallFunction


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class CalledFunction(msgspec.Struct):
    name: str
    arguments: str  # JSON text, as OpenAI gives it


class MessageToolCall(msgspec.Struct):
    id: str
    function: CalledFunction
    type: str = "function"


class OpenAIMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool's: the call it answers


def chat_messages(messages: list[OpenAIMessage]) -> list[ChatMessage] | Error:
    if not messages:
        return invalid("messages must not be empty", "messages")
    parsed = []
    call_ids: set[str] = set()  # of the calls made so far, which tool results answer
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        role = "system" if message.role == "developer" else message.role  # OpenAI's newer name
        if role == "function":
            return invalid("function messages are not supported; send tool messages", f"{param}.role")
        if role not in ("system", "user", "assistant", "tool"):
            return invalid(f"unknown role `{message.role}`", f"{param}.role")
        calls = None
        if message.tool_calls:
            if role != "assistant":
                return invalid("only an assistant's message makes tool calls", f"{param}.tool_calls")
            calls = _tool_calls(message.tool_calls, f"{param}.tool_calls")
            if isinstance(calls, Error):
                return calls
            call_ids.update(call.id for call in calls)
        content = _message_text(message.content, role, f"{param}.content")
        if isinstance(content, Error):
            return content
        answered = None
        if role == "tool":
            answered = message.tool_call_id
            if answered is None:
                return invalid("a tool message needs `tool_call_id`", f"{param}.tool_call_id")
            if answered not in call_ids:
                return invalid(f"no earlier tool call has the id `{answered}`", f"{param}.tool_call_id")
        parsed.append(ChatMessage(role, content, tool_calls=calls, tool_call_id=answered))
    if not any(m.content or m.tool_calls for m in parsed):
        return invalid("messages are empty: every content is blank", "messages")
    return parsed


def _tool_calls(calls: list[MessageToolCall], param: str) -> list[ChatToolCall] | Error:
    parsed = []
    for j, call in enumerate(calls):
        try:
            arguments = json.loads(call.function.arguments)
        except (ValueError, RecursionError) as exc:
            return invalid(f"the arguments are not JSON: {exc}", f"{param}[{j}].function.arguments")
        parsed.append(ChatToolCall(call.id, ToolCallFunction(call.function.name, arguments)))
    return parsed


def _message_text(content: str | list[ContentPart] | None, role: str, param: str) -> str | Error:
    if content is None:
        # OpenAI lets an assistant turn omit content (one with tool calls, or a refusal).
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
