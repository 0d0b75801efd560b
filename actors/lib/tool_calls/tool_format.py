"""What a family of models writes for its tool calls: how the parser finds them (`CallSyntax`), and
the exact text a constrained reply of calls takes (`call_begin` + arguments + `call_end`, calls
joined by `separator`, the whole between `before` and `after`), which the parser reads back."""

import json
from dataclasses import dataclass

from actors.lib.tool_calls.sections import CallSyntax


@dataclass(frozen=True)
class ToolFormat:
    name: str
    syntax: CallSyntax
    name_key_prefix: str  # the text before the function's name (as a JSON string)
    arguments_prefix: str  # the text between the name and the arguments
    call_end: str
    separator: str
    before: str = ""
    after: str = ""

    def call_begin(self, function: str) -> str:
        return self.name_key_prefix + json.dumps(function) + self.arguments_prefix
