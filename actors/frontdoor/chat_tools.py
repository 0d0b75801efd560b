"""A chat request's tool and reasoning fields over HTTP: `tools`, `tool_choice`,
`parallel_tool_calls`, `chat_template_kwargs`, vLLM's `include_reasoning` and SGLang's
`separate_reasoning`, as the chat body declares them (openai_protocol.py). They mean what the same
fields of a bus request mean: actors/lib/chat_tools.py checks both, with the field named, and turns
them into what the template renders, how the replies are read and a demanded call's grammar.
"""

from typing import Annotated, Any, Protocol

import msgspec

from actors.lib.chat_format import ChatFormat
from actors.lib.chat_tools import ChatTools, FunctionTool, ToolParams
from actors.lib.chat_tools import chat_tools as checked_tools
from schemas.errors import Error
from schemas.generate import RESERVED_TEMPLATE_KWARGS, ChatTemplateArgs, ToolChoice

# The body's names for the fields, which its errors name.
HTTP_PARAMS = ToolParams(tools="tools", tool_choice="tool_choice", kwargs="chat_template_kwargs")
# The template's own variables; the names apply_chat_template keeps for itself are refused
# (actors/lib/chat_tools.py), and /openapi.json says so.
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


def chat_tools(fields: ToolFields, chat_format: ChatFormat) -> ChatTools | Error:
    asked = ChatTemplateArgs(
        [msgspec.to_builtins(tool) for tool in fields.tools or []],
        fields.chat_template_kwargs or {},
        fields.tool_choice,
        fields.parallel_tool_calls is not False,
    )
    return checked_tools(
        asked,
        chat_format,
        HTTP_PARAMS,
        read_reasoning=fields.separate_reasoning is not False,
        include_reasoning=fields.include_reasoning is not False,
    )
