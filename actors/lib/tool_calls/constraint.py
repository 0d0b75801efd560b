"""The grammar a reply must follow when the request demands a call (`tool_choice` "required" or a
named function), so the call always parses and its arguments match the tool's schema.

Pure functions over the request's tools, with no xgrammar here (it brings torch into the doors):
the structural tag is xgrammar's JSON (a tokenizer compiles it, as any constraint, and refuses a
tool schema it cannot follow, naming `tools`): the reply is the family's own text for one call
or several (tool_format.py), after a thinking block where the model reasons first, so the same
parser reads a constrained reply as any other. `tool_call_schema` is the calls as JSON alone, the
array of `{"name", "arguments"}` that vLLM constrains to, for a backend that takes a JSON schema.
"""

from dataclasses import dataclass
from typing import Any, Literal

from actors.lib.tool_calls.tool_format import ToolFormat

# Where a reply's thinking stands when it starts: none expected, an optional `<think>` block
# (Qwen3), or already open in the prompt (DeepSeek-R1's template), so the reply closes it first.
ReasoningStart = Literal["none", "optional", "open"]
THINK_START, THINK_END = "<think>", "</think>"
_AFTER_THINKING = "\n\n"
_ANY_OBJECT = {"type": "object"}  # the arguments of a tool without parameters


@dataclass(frozen=True)
class ToolCallConstraint:
    json_schema: dict[str, Any]  # the calls as a JSON array (tool_call_schema)
    structural_tag: dict[str, Any]  # the reply's whole text, for xgrammar


def chosen_tools(tools: list[dict], tool_choice: str | dict) -> list[dict]:
    """The tools a reply may call: all of them, or the one named (the caller checked it exists)."""
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        return [t for t in tools if t["function"]["name"] == name]
    return tools


def tool_call_schema(tools: list[dict], tool_choice: str | dict, parallel: bool) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t["function"]["name"]]},
                "arguments": _parameters(t),
            },
            "required": ["name", "arguments"],
        }
        for t in chosen_tools(tools, tool_choice)
    ]
    schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if isinstance(tool_choice, dict) or not parallel:
        schema["maxItems"] = 1
    return schema


def tool_call_constraint(
    fmt: ToolFormat,
    tools: list[dict],
    tool_choice: str | dict | None,
    parallel: bool,
    reasoning: ReasoningStart = "none",
) -> ToolCallConstraint | None:
    """None unless `tool_choice` demands a call."""
    if tool_choice in (None, "none", "auto"):
        return None
    chosen = chosen_tools(tools, tool_choice)
    calls = {
        "type": "tags_with_separator",
        "tags": [
            {
                "type": "tag",
                "begin": fmt.call_begin(t["function"]["name"]),
                "content": {"type": "json_schema", "json_schema": _parameters(t)},
                "end": fmt.call_end,
            }
            for t in chosen
        ],
        "separator": fmt.separator,
        "at_least_one": True,
        "stop_after_first": isinstance(tool_choice, dict) or not parallel,
    }
    elements = [_thinking(reasoning)] if reasoning != "none" else []
    elements += [_const(fmt.before)] if fmt.before else []
    elements += [calls] + ([_const(fmt.after)] if fmt.after else [])
    whole = elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}
    structural_tag = {"type": "structural_tag", "format": whole}
    return ToolCallConstraint(tool_call_schema(tools, tool_choice, parallel), structural_tag)


def _parameters(tool: dict) -> dict[str, Any]:
    return tool["function"].get("parameters") or _ANY_OBJECT


def _const(text: str) -> dict:
    return {"type": "const_string", "value": text}


def _thinking(reasoning: ReasoningStart) -> dict:
    begin = "" if reasoning == "open" else THINK_START
    block = {"type": "tag", "begin": begin, "content": {"type": "any_text"}, "end": THINK_END}
    thinking = {"type": "sequence", "elements": [block, _const(_AFTER_THINKING)]}
    return thinking if reasoning == "open" else {"type": "optional", "content": thinking}
