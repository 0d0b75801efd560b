"""A chat request's tool and reasoning fields: `tools`, `tool_choice`, `parallel_tool_calls`,
`chat_template_kwargs`, vLLM's `include_reasoning` and SGLang's `separate_reasoning`. Checked here,
with the field named, and turned into what the template renders beside the messages, how the
replies are read, and the grammar that a demanded call needs.

No I/O. `tool_choice` "none" offers no tools and reads no calls, as vLLM does; "required" and a
named function are read like "auto" but for JSON at the start, which counts as calls, and carry the
constraint (actors/lib/tool_calls/constraint.py) that makes the call parse.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import msgspec

from actors.frontdoor.request_fields import invalid
from actors.lib.chat_format import ChatFormat
from actors.lib.chat_reply import ReplyOptions
from actors.lib.tool_calls.constraint import (
    ReasoningStart,
    ToolCallConstraint,
    tool_call_constraint,
)
from schemas.errors import Error
from schemas.generate import RESERVED_TEMPLATE_KWARGS, ChatTemplateArgs

# OpenAI's rule for function names, and a dot; a name is written into the constrained text as is.
FunctionName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
_REASONING_START: dict[str, ReasoningStart] = {"deepseek-r1": "open", "deepseek_r1": "open", "qwen3": "optional"}


class FunctionDefinition(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments
    # A demanded call (tool_choice required or named) follows `parameters` whatever `strict` says;
    # under "auto" the reply is not constrained, strict or not.
    strict: bool | None = None


class FunctionTool(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionChoice(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionChoice


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
# The template's own variables; the names apply_chat_template keeps for itself are refused
# (`_check_kwargs`), and /openapi.json says so.
TemplateKwargs = Annotated[
    dict[str, Any],
    msgspec.Meta(extra_json_schema={"propertyNames": {"not": {"enum": sorted(RESERVED_TEMPLATE_KWARGS)}}}),
]


class ToolFields(Protocol):
    """The fields read here, as the chat request declares them (openai_protocol.py)."""

    tools: list[FunctionTool] | None
    tool_choice: ToolChoice | None
    parallel_tool_calls: bool | None
    chat_template_kwargs: TemplateKwargs | None  # the template's own variables, e.g. enable_thinking
    include_reasoning: bool | None  # vLLM's: False leaves reasoning_content out
    separate_reasoning: bool | None  # SGLang's: False leaves the thinking in content


@dataclass(frozen=True)
class ChatTools:
    template: ChatTemplateArgs | None  # None: the messages alone
    reply: ReplyOptions
    constraint: ToolCallConstraint | None  # with tool_choice required or a named function


def chat_tools(fields: ToolFields, chat_format: ChatFormat) -> ChatTools | Error:
    tools = [msgspec.to_builtins(tool) for tool in fields.tools or []]
    error = _check_tools(tools) or _check_kwargs(fields.chat_template_kwargs or {})
    if error:
        return error
    choice = _tool_choice(fields.tool_choice, tools)
    if isinstance(choice, Error):
        return choice
    parallel = fields.parallel_tool_calls is not False
    offered = tools if tools and choice != "none" else []
    reasoning = chat_format.reasoning_parser if fields.separate_reasoning is not False else "none"
    reply = ReplyOptions(
        tool_format=chat_format.tool_format if offered else None,
        tool_choice="named" if isinstance(choice, dict) else ("auto" if choice in ("none", "auto") else choice),
        parallel=parallel,
        reasoning_parser=reasoning,
        include_reasoning=fields.include_reasoning is not False,
        think_ids=chat_format.think_ids,
    )
    constraint = None
    if offered and choice != "auto":
        start = _REASONING_START.get(chat_format.reasoning_parser, "none")
        constraint = tool_call_constraint(chat_format.tool_format, tools, choice, parallel, start)
    kwargs = fields.chat_template_kwargs or {}
    template = ChatTemplateArgs(offered, kwargs) if offered or kwargs else None
    return ChatTools(template, reply, constraint)


def _check_tools(tools: list[dict]) -> Error | None:
    seen = set()
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if name in seen:
            return invalid(f"two tools are named `{name}`", f"tools[{i}].function.name")
        seen.add(name)
    return None


def _check_kwargs(kwargs: dict[str, Any]) -> Error | None:
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            return invalid(f"`{key}` is not a template variable", f"chat_template_kwargs.{key}")
    return None


def _tool_choice(choice: str | NamedToolChoice | None, tools: list[dict]) -> str | dict | Error:
    """ "none", "auto", "required", or the named choice as a dict."""
    if choice is None:
        return "auto"
    if choice in ("none", "auto"):
        return choice
    if not tools:
        return invalid("tool_choice needs tools to choose from", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        if not any(t["function"]["name"] == choice.function.name for t in tools):
            return invalid(f"no tool is named `{choice.function.name}`", "tool_choice")
        return msgspec.to_builtins(choice)
    return choice
