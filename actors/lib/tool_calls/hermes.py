"""Hermes' format, which Qwen2.5, Qwen3 and most templates with tools use: each call is a JSON
object in its own `<tool_call>` block, text may come before the calls.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from actors.lib.tool_calls.sections import CallSyntax
from actors.lib.tool_calls.tool_format import ToolFormat

FORMAT = ToolFormat(
    name="hermes",
    syntax=CallSyntax(opener="<tool_call>", closer="</tool_call>"),
    name_key_prefix='<tool_call>\n{"name": ',
    arguments_prefix=', "arguments": ',
    call_end="}\n</tool_call>",
    separator="\n",
)
