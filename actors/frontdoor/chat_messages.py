"""OpenAI's chat messages in, the conversation the tokenizer renders out (`ChatMessage`s): text
content, an assistant's tool calls and the tool results that answer them.

No I/O. Each role is a Struct of its own, tagged by `role`, so the decoder (and /openapi.json, made
from the same Structs) refuses a field a role does not take, and every field a role takes is
rendered, but those a client sends back with the history that mean nothing for the next reply: an
assistant's `reasoning_content`, which this server's own replies carry (earlier thinking is dropped
on every route), and what the `openai` SDK adds to a message it hands back (`parsed`, a streamed
call's `index`, null `refusal`, `audio` and `function_call`), all accepted with no effect. What the decoder cannot see is checked here, with the field named: a tool result that
answers no earlier call, arguments that are not JSON (templates read them decoded, as vLLM hands
them over).
"""

import json
from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.request_fields import invalid
from schemas.errors import Error
from schemas.generate import ChatMessage, ChatToolCall, ToolCallFunction


class TextPart(msgspec.Struct, forbid_unknown_fields=True):
    """A content part: text only (images, audio and files are not read by the models served)."""

    type: Literal["text"]
    text: str


Content = str | list[TextPart]  # parts are joined by newlines, as vLLM joins them


class CalledFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str  # JSON text, as OpenAI gives it
    parsed_arguments: Any = None  # the SDK's copy of the arguments, decoded: no effect


class MessageToolCall(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    function: CalledFunction
    type: Literal["function"] = "function"
    index: int | None = None  # its place among a streamed reply's calls, as the SDK keeps it: no effect


class SystemMessage(msgspec.Struct, tag_field="role", tag="system", forbid_unknown_fields=True):
    content: Content


class DeveloperMessage(msgspec.Struct, tag_field="role", tag="developer", forbid_unknown_fields=True):
    """OpenAI's newer name of a system message."""

    content: Content


class UserMessage(msgspec.Struct, tag_field="role", tag="user", forbid_unknown_fields=True):
    content: Content


class AssistantMessage(msgspec.Struct, tag_field="role", tag="assistant", forbid_unknown_fields=True):
    content: Content | None = None  # none with tool calls
    tool_calls: list[MessageToolCall] | None = None
    reasoning_content: str | None = None  # accepted, not rendered: earlier thinking is dropped
    # What the SDK's message objects carry beside, sent back with the history: no effect. `parsed`
    # is the content decoded; the others are null in every reply of this server (a refusal's text
    # would mean something, and is refused).
    parsed: Any = None
    refusal: None = None
    audio: None = None
    function_call: None = None
    annotations: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=0)] | None = None


class ToolMessage(msgspec.Struct, tag_field="role", tag="tool", forbid_unknown_fields=True):
    content: Content
    tool_call_id: str  # the call it answers


OpenAIMessage = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


def chat_messages(messages: list[OpenAIMessage]) -> list[ChatMessage] | Error:
    parsed = []
    call_ids: set[str] = set()  # of the calls made so far, which tool results answer
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        content = _text(message.content)
        match message:
            case SystemMessage() | DeveloperMessage():
                parsed.append(ChatMessage("system", content))
            case UserMessage():
                parsed.append(ChatMessage("user", content))
            case AssistantMessage():
                calls = _tool_calls(message.tool_calls or [], f"{param}.tool_calls")
                if isinstance(calls, Error):
                    return calls
                call_ids.update(call.id for call in calls)
                parsed.append(ChatMessage("assistant", content, tool_calls=calls or None))
            case ToolMessage():
                if message.tool_call_id not in call_ids:
                    return invalid(f"no earlier tool call has the id `{message.tool_call_id}`", f"{param}.tool_call_id")
                parsed.append(ChatMessage("tool", content, tool_call_id=message.tool_call_id))
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


def _text(content: Content | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)
