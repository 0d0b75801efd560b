"""Anthropic's Messages API out: the `message` reply, the events of a stream (`message_start`,
`content_block_start`/`_delta`/`_stop`, `message_delta`, `message_stop`), and errors in Anthropic's
shape, which its SDK reads.

A reply's pieces (from `ReplyReader`) become content blocks in the order they come: `thinking`,
`text`, a `tool_use` per call. No I/O; the serving is dialect_serving.py's.
"""

import copy
import json

from aiohttp import web

from actors.frontdoor.chat_translation import ParamMap
from actors.frontdoor.dialect_serving import Ending
from actors.lib.chat_reply import ReplyDelta
from actors.lib.tool_calls.sections import assemble
from schemas.errors import Error

Event = tuple[str, dict]

# Anthropic's error `type` per status; other 4xx are invalid requests, other 5xx api errors.
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(error: Error) -> dict:
    status = error.http_status
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = f"{error.param}: {error.message}" if error.param and error.param not in error.message else error.message
    return {"type": "error", "error": {"type": kind, "message": message}}


class AnthropicDialect:
    """`params`: the Messages body's fields of the chat path's; None before a body was read."""

    def __init__(self, model: str, stop_sequences: list[str], params: ParamMap | None = None) -> None:
        self.model = model
        self.stop_sequences = stop_sequences
        self.params = params

    def error_response(self, error: Error) -> web.Response:
        if self.params is not None:  # an error of the chat path: named by the Messages body's field
            error = self.params.client_error(error)
        return web.json_response(anthropic_error(error), status=error.http_status)

    def writer(self, request_id: str, created: int, input_tokens: int) -> "MessageWriter":
        return MessageWriter(self, request_id, input_tokens)


class MessageWriter:
    def __init__(self, dialect: AnthropicDialect, request_id: str, input_tokens: int) -> None:
        self.dialect = dialect
        self.id = f"msg_{request_id}"
        self.input_tokens = input_tokens
        self.blocks: list[dict] = []
        self.open: dict | None = None  # the block deltas are going to
        self.called = False

    def whole(self, reply: ReplyDelta, ending: Ending) -> dict:
        content = []
        if reply.reasoning:
            content.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
        if reply.content:
            content.append({"type": "text", "text": reply.content})
        for call in assemble(reply.calls):
            self.called = True
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)})
        return self._message(content) | self._stop(ending) | {"usage": self._usage(ending)}

    def start(self) -> list[Event]:
        message = self._message([]) | {"stop_reason": None, "stop_sequence": None}
        return [("message_start", {"type": "message_start", "message": message})]

    def add(self, delta: ReplyDelta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            events += self._into("thinking", {"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.content:
            events += self._into("text", {"type": "text_delta", "text": delta.content})
        for call in delta.calls:
            if call.name is not None:  # a call's first piece
                self.called = True
                events += self._close()
                events += self._open({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            if call.arguments:
                delta_json = {"type": "input_json_delta", "partial_json": call.arguments}
                events.append(self._event("content_block_delta", delta=delta_json))
        return events

    def end(self, ending: Ending) -> list[Event]:
        events = self._close()
        events.append(
            ("message_delta", {"type": "message_delta", "delta": self._stop(ending), "usage": self._usage(ending)})
        )
        return events + [("message_stop", {"type": "message_stop"})]

    def fail(self, error: Error) -> list[Event]:
        return [("error", anthropic_error(error))]

    def _message(self, content: list[dict]) -> dict:
        usage = {"input_tokens": self.input_tokens, "output_tokens": 0}
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.dialect.model,
            "content": content,
            "usage": usage,
        }

    def _usage(self, ending: Ending) -> dict:
        return {
            "input_tokens": ending.input_tokens,
            "output_tokens": ending.output_tokens,
            "cache_read_input_tokens": ending.cached_tokens,
        }

    def _stop(self, ending: Ending) -> dict:
        sequence = None
        if ending.finish_reason == "length":
            reason = "max_tokens"
        elif self.called:
            reason = "tool_use"
        elif isinstance(ending.matched_stop, str) and ending.matched_stop in self.dialect.stop_sequences:
            reason, sequence = "stop_sequence", ending.matched_stop
        else:
            reason = "end_turn"
        return {"stop_reason": reason, "stop_sequence": sequence}

    def _into(self, kind: str, delta: dict) -> list[Event]:
        events: list[Event] = []
        if self.open is None or self.open["type"] != kind:
            events += self._close()
            start = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            events += self._open(start)
        return events + [self._event("content_block_delta", delta=delta)]

    def _open(self, block: dict) -> list[Event]:
        self.blocks.append(block)
        self.open = block
        return [self._event("content_block_start", content_block=copy.deepcopy(block))]

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        event = self._event("content_block_stop")
        self.open = None
        return [event]

    def _event(self, kind: str, **fields) -> Event:
        return kind, {"type": kind, "index": len(self.blocks) - 1, **fields}


def _input(arguments: str) -> dict:
    """A call's arguments as the object Anthropic gives; arguments cut short (a reply that hit
    max_tokens) or not an object give an empty one."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
