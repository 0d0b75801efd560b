"""Mistral's calls: `[TOOL_CALLS]` and a JSON array of calls. `[TOOL_CALLS]` is a special token,
which detokenization drops unless a client keeps special tokens, so an array of calls at the very
start of the reply counts too; a constrained reply is that bare array.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
"""

from actors.lib.tool_calls.sections import CallSyntax
from actors.lib.tool_calls.tool_format import ToolFormat

FORMAT = ToolFormat(
    name="mistral",
    syntax=CallSyntax(opener="[TOOL_CALLS]", json_at_start=True),
    name_key_prefix='{"name": ',
    arguments_prefix=', "arguments": ',
    call_end="}",
    separator=", ",
    before="[",
    after="]",
)
