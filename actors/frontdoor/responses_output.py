"""OpenAI's Responses API out: the `response` object, and the typed events of a stream in the order
and with the sequence numbers the `openai` SDK's stream reader expects.

A reply's pieces (from `ReplyReader`) become output items in the order they come: a `reasoning`
item for the thinking, a `message` item with one `output_text` part for the text, a
`function_call` item per call. No I/O; the serving is dialect_serving.py's.
"""

import copy
import time

from actors.frontdoor.dialect_serving import Ending
from actors.frontdoor.http_errors import error_response
from actors.frontdoor.openai_responses import error_body
from actors.frontdoor.responses_api import ResponsesParsed
from actors.lib.chat_reply import ReplyDelta
from actors.lib.tool_calls.sections import assemble
from schemas.errors import Error

Event = tuple[str, dict]


class ResponsesDialect:
    def __init__(self, parsed: ResponsesParsed, model: str) -> None:
        self.echo = parsed.echo
        self.params = parsed.params
        self.model = model

    def error_response(self, error: Error):
        # OpenAI's error body, as every OpenAI route answers, naming the Responses body's field.
        return error_response(self.params.client_error(error))

    def writer(self, request_id: str, created: int, input_tokens: int) -> "ResponseWriter":
        return ResponseWriter(self, request_id, created)


class ResponseWriter:
    def __init__(self, dialect: ResponsesDialect, request_id: str, created: int) -> None:
        self.dialect = dialect
        self.id = f"resp_{request_id}"
        self.created = created
        self.output: list[dict] = []  # the items, complete or growing
        self.open: dict | None = None  # the item events are going to
        self.sequence = 0

    def response(self, status: str, ending: Ending | None = None) -> dict:
        usage = incomplete = None
        if ending is not None:
            usage = {
                "input_tokens": ending.input_tokens,
                "input_tokens_details": {"cached_tokens": ending.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": ending.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},  # not counted apart from the answer
                "total_tokens": ending.input_tokens + ending.output_tokens,
            }
            if ending.finish_reason == "length":
                incomplete = {"reason": "max_output_tokens"}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "model": self.dialect.model,
            "output": list(self.output),
            "store": False,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": usage,
            "metadata": {},
            "previous_response_id": None,
            **self.dialect.echo,
        } | ({"completed_at": int(time.time())} if status == "completed" else {})

    def whole(self, reply: ReplyDelta, ending: Ending) -> dict:
        self._events(reply, whole=True)
        self._close()
        return self.response(_status(ending), ending)

    def start(self) -> list[Event]:
        in_progress = self.response("in_progress")
        return [
            self._event("response.created", response=in_progress),
            self._event("response.in_progress", response=in_progress),
        ]

    def add(self, delta: ReplyDelta) -> list[Event]:
        return self._events(delta, whole=False)

    def end(self, ending: Ending) -> list[Event]:
        events = self._close()
        status = _status(ending)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return events + [self._event(kind, response=self.response(status, ending))]

    def fail(self, error: Error) -> list[Event]:
        body = error_body(error)["error"]
        failed = self.response("failed") | {"error": {"code": body["type"], "message": error.message}}
        return self._close() + [self._event("response.failed", response=failed)]

    def _events(self, delta: ReplyDelta, whole: bool) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            events += self._into("reasoning", delta.reasoning)
        if delta.content:
            events += self._into("message", delta.content)
        calls = assemble(delta.calls) if whole else delta.calls
        for call in calls:
            if call.name is not None:  # a call's first piece
                events += self._close()
                item = {"id": f"fc_{call.id}", "type": "function_call", "status": "in_progress"}
                events += self._add_item(item | {"call_id": call.id, "name": call.name, "arguments": ""})
            if call.arguments:
                self.open["arguments"] += call.arguments
                events.append(self._item_event("response.function_call_arguments.delta", delta=call.arguments))
        return events

    def _into(self, kind: str, text: str) -> list[Event]:
        """Text for the open item of `kind`, which is opened (and the one before closed) if need be."""
        events: list[Event] = []
        if self.open is None or self.open["type"] != kind:
            events += self._close()
            index = len(self.output)
            if kind == "message":
                item = {"id": f"msg_{self.id}_{index}", "type": "message", "role": "assistant", "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"id": f"rs_{self.id}_{index}", "type": "reasoning", "summary": [], "content": []}
                part = {"type": "reasoning_text", "text": ""}
            events += self._add_item(item | {"status": "in_progress"})
            self.open["content"].append(part)
            events.append(self._item_event("response.content_part.added", content_index=0, part=part))
        self.open["content"][0]["text"] += text
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == "message" else {}
        events.append(self._item_event(name, content_index=0, delta=text, **extra))
        return events

    def _add_item(self, item: dict) -> list[Event]:
        self.output.append(item)
        self.open = item
        return [self._event("response.output_item.added", output_index=len(self.output) - 1, item=item)]

    def _close(self) -> list[Event]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = "completed"
        events = []
        if item["type"] == "function_call":
            arguments = {"arguments": item["arguments"], "name": item["name"]}
            events.append(self._item_event("response.function_call_arguments.done", item=item, **arguments))
        else:
            part = item["content"][0]
            name = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            extra = {"logprobs": []} if item["type"] == "message" else {}
            events.append(self._item_event(name, item=item, content_index=0, text=part["text"], **extra))
            events.append(self._item_event("response.content_part.done", item=item, content_index=0, part=part))
        index = self.output.index(item)
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def _item_event(self, kind: str, item: dict | None = None, **fields) -> Event:
        item = item or self.open
        return self._event(kind, item_id=item["id"], output_index=self.output.index(item), **fields)

    def _event(self, kind: str, **fields) -> Event:
        # A copy: the items go on growing after the event is made.
        event = {"type": kind, "sequence_number": self.sequence, **copy.deepcopy(fields)}
        self.sequence += 1
        return kind, event


def _status(ending: Ending) -> str:
    return "incomplete" if ending.finish_reason == "length" else "completed"
