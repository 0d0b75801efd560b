"""A chat request's tool fields, as both doors take them: `tools`, `tool_choice`,
`parallel_tool_calls` and the template's variables, from an HTTP chat body
(actors/frontdoor/chat_tools.py) or a bus `GenerateRequest.chat_template` (actors/gateway/). Checked
here, each error naming the field as that door's client wrote it (`ToolParams`), and turned into
what the template renders beside the messages, how the replies are read, and the grammar that a
demanded call needs, so a bus client's `tool_choice` means what an HTTP client's does.

No I/O. `tool_choice` "none" offers no tools and reads no calls, as vLLM does; "required" and a
named function are read like "auto" but for JSON at the start, which counts as calls, and carry the
constraint (actors/lib/tool_calls/constraint.py) that makes the call parse.
"""

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from actors.lib.chat_format import ChatFormat
from actors.lib.chat_reply import ReplyOptions
from actors.lib.tool_calls.constraint import ReasoningStart, ToolCallConstraint, tool_call_constraint
from schemas.errors import Error
from schemas.generate import RESERVED_TEMPLATE_KWARGS, ChatTemplateArgs, Constraint, GenerateRequest, NamedToolChoice

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


@dataclass(frozen=True)
class ToolParams:
    """What a door's clients call the fields, which its errors name."""

    tools: str
    tool_choice: str
    kwargs: str


@dataclass(frozen=True)
class ChatTools:
    template: ChatTemplateArgs | None  # the tools offered and the variables; None: the messages alone
    reply: ReplyOptions
    constraint: ToolCallConstraint | None  # with tool_choice required or a named function

    def applied(self, request: GenerateRequest, params: ToolParams) -> GenerateRequest | Error:
        """`request` as the pipeline takes it: the template with the tools offered, and a demanded
        call decoded under its grammar, which no other structured output may share."""
        request = msgspec.structs.replace(request, chat_template=self.template)
        if self.constraint is None:
            return request
        if request.params.constraint is not None:
            return _invalid(
                "a tool_choice that demands a call cannot be combined with structured output", params.tool_choice
            )
        grammar = Constraint("structural_tag", json.dumps(self.constraint.structural_tag), params.tools)
        return msgspec.structs.replace(request, params=msgspec.structs.replace(request.params, constraint=grammar))


def chat_tools(
    asked: ChatTemplateArgs,
    chat_format: ChatFormat,
    params: ToolParams,
    read_reasoning: bool = True,
    include_reasoning: bool = True,
) -> ChatTools | Error:
    """`read_reasoning` (SGLang's `separate_reasoning`): False leaves the thinking in the text;
    `include_reasoning` (vLLM's): False leaves it out of the reply."""
    tools = _tools(asked.tools, params.tools)
    if isinstance(tools, Error):
        return tools
    error = _check_names(tools, params.tools) or _check_kwargs(asked.kwargs, params.kwargs)
    if error:
        return error
    choice = _tool_choice(asked.tool_choice, tools, params.tool_choice)
    if isinstance(choice, Error):
        return choice
    parallel = asked.parallel_tool_calls
    offered = tools if tools and choice != "none" else []
    reply = ReplyOptions(
        tool_format=chat_format.tool_format if offered else None,
        tool_choice="named" if isinstance(choice, dict) else ("auto" if choice in ("none", "auto") else choice),
        parallel=parallel,
        reasoning_parser=chat_format.reasoning_parser if read_reasoning else "none",
        include_reasoning=include_reasoning,
        think_ids=chat_format.think_ids,
    )
    constraint = None
    if offered and choice != "auto":
        start = _REASONING_START.get(chat_format.reasoning_parser, "none")
        constraint = tool_call_constraint(chat_format.tool_format, tools, choice, parallel, start)
    template = ChatTemplateArgs(offered, asked.kwargs) if offered or asked.kwargs else None
    return ChatTools(template, reply, constraint)


def _tools(tools: list[dict], param: str) -> list[dict] | Error:
    """Function tools as OpenAI writes them (a bus client's are not checked on decoding)."""
    try:
        return [msgspec.to_builtins(tool) for tool in msgspec.convert(tools, list[FunctionTool])]
    except msgspec.ValidationError as exc:
        detail, _, where = str(exc).partition(" - at `$")
        where = where.rstrip("`")
        if detail.startswith("Object missing required field `"):
            where += "." + detail.removeprefix("Object missing required field `").rstrip("`")
        elif detail.startswith("Object contains unknown field `"):
            where += "." + detail.removeprefix("Object contains unknown field `").rstrip("`")
        return _invalid(f"Invalid value for `{param}{where}`: {detail}", param + where)


def _check_names(tools: list[dict], param: str) -> Error | None:
    seen = set()
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if name in seen:
            return _invalid(f"two tools are named `{name}`", f"{param}[{i}].function.name")
        seen.add(name)
    return None


def _check_kwargs(kwargs: dict[str, Any], param: str) -> Error | None:
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            return _invalid(f"`{key}` is not a template variable", f"{param}.{key}")
    return None


def _tool_choice(choice: str | NamedToolChoice | None, tools: list[dict], param: str) -> str | dict | Error:
    """ "none", "auto", "required", or the named choice as a dict."""
    if choice is None:
        return "auto"
    if choice in ("none", "auto"):
        return choice
    if not tools:
        return _invalid("tool_choice needs tools to choose from", param)
    if isinstance(choice, NamedToolChoice):
        if not any(t["function"]["name"] == choice.function.name for t in tools):
            return _invalid(f"no tool is named `{choice.function.name}`", param)
        return msgspec.to_builtins(choice)
    return choice


def _invalid(message: str, param: str) -> Error:
    return Error("invalid_request", message, param=param)
