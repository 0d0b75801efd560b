"""Llama 3.1 and 3.2's JSON calls: the reply is the call, a JSON object with `parameters`,
optionally after `<|python_tag|>` (a special token, so usually gone from the text); several calls
are separated by `;`. A reply that does not start with one is text.

    {"name": "get_weather", "parameters": {"city": "Paris"}}
"""

from actors.lib.tool_calls.sections import CallSyntax
from actors.lib.tool_calls.tool_format import ToolFormat

FORMAT = ToolFormat(
    name="llama3_json",
    syntax=CallSyntax(opener="<|python_tag|>", json_at_start=True, separators=";,"),
    name_key_prefix='{"name": ',
    arguments_prefix=', "parameters": ',
    call_end="}",
    separator="; ",
)
