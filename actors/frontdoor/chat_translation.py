"""The other chat dialects onto the chat path: a Responses or Messages body, translated into a chat
completions body, is parsed by `parse_chat_request` itself, so the messages, tools, template
variables and sampling fields meet the very checks a chat request meets.

An error found there names a field of the chat body; `ParamMap` names the client's own field
instead (`messages[3]` back to `input[5]`, `tools[0].function.parameters` to `tools[0].input_schema`).
No I/O.
"""

import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from actors.frontdoor.chat_format import ChatFormat
from actors.frontdoor.openai_protocol import ParsedRequest, parse_chat_request
from actors.frontdoor.request_fields import invalid
from schemas.errors import Error

T = TypeVar("T")
_MESSAGE = re.compile(r"^messages\[(\d+)\]")
_TOOL_FUNCTION = re.compile(r"^(tools\[\d+\])\.function\.")


@dataclass
class ParamMap:
    """Where each chat message and field came from in the client's body."""

    messages: list[str] = field(default_factory=list)  # per chat message: the client's field
    fields: dict[str, str] = field(default_factory=dict)  # chat field -> the client's
    tool_fields: dict[str, str] = field(default_factory=dict)  # a tool's `function.<f>` -> the client's `<f>`
    message_fields: dict[str, str] = field(default_factory=dict)  # a chat message's field -> the client's

    def client_param(self, param: str | None) -> str | None:
        if param is None:
            return None
        if match := _MESSAGE.match(param):
            index = int(match.group(1))
            if index < len(self.messages):
                rest = param[match.end() :]
                head, sep, tail = rest.removeprefix(".").partition(".")
                if head in self.message_fields:
                    rest = f".{self.message_fields[head]}{sep}{tail}"
                return self.messages[index] + rest
        if match := _TOOL_FUNCTION.match(param):
            rest = param[match.end() :]
            head, dot, tail = rest.partition(".")
            return f"{match.group(1)}.{self.tool_fields.get(head, head)}{dot}{tail}"
        head, dot, tail = param.partition(".")
        return self.fields.get(head, head) + dot + tail


def onto_chat(chat_body: dict, served_model: str, chat_format: ChatFormat, params: ParamMap) -> ParsedRequest | Error:
    parsed = parse_chat_request(msgspec.json.encode(chat_body), served_model, chat_format)
    if isinstance(parsed, Error):
        return msgspec.structs.replace(parsed, param=params.client_param(parsed.param))
    return parsed


def convert(value: Any, kind: type[T], param: str) -> T | Error:
    """A piece of the body read as `kind`, a complaint naming the field under `param`."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        detail, _, path = str(exc).partition(" - at `$")
        path = param + path.rstrip("`")
        for prefix, say in (("Object missing required field `", "is required"),):
            if detail.startswith(prefix):
                path += "." + detail.removeprefix(prefix).rstrip("`")
                return invalid(f"`{path}` {say}", path)
        return invalid(f"Invalid value for `{path}`: {detail}", path)
