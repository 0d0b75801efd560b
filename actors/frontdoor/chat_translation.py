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

from actors.frontdoor.openai_protocol import ParsedRequest, parse_chat_request
from actors.frontdoor.request_fields import validation_error
from actors.lib.chat_format import ChatFormat
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
        for chat_field in sorted(self.fields, key=len, reverse=True):  # the longest first: `a.b` before `a`
            if param == chat_field or param.startswith(chat_field + ".") or param.startswith(chat_field + "["):
                return self.fields[chat_field] + param[len(chat_field) :]
        return param

    def client_error(self, error: Error) -> Error:
        """An error of the chat path, downstream ones included, naming the client's own field."""
        return msgspec.structs.replace(error, param=self.client_param(error.param))


def onto_chat(chat_body: dict, served_model: str, chat_format: ChatFormat, params: ParamMap) -> ParsedRequest | Error:
    parsed = parse_chat_request(msgspec.json.encode(chat_body), served_model, chat_format)
    return params.client_error(parsed) if isinstance(parsed, Error) else parsed


def convert(value: Any, kind: type[T], param: str) -> T | Error:
    """A piece of the body read as `kind`, a complaint naming the field under `param`."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        return validation_error(str(exc), at=param)
