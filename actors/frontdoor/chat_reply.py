"""A chat reply's text read as OpenAI's message parts: the thinking (`reasoning_content`), the
answer (`content`) and the tool calls, whole or delta by delta.

One `ReplyReader` per choice: the thinking is split off first (actors/lib/reasoning.py), then the
answer's calls (actors/lib/tool_calls/). A whole reply is read as one piece, so a stream's deltas
make up the same message as the reply whole. Plain replies (no tools, no reasoning parser) get no
reader and go out as they come.
"""

from dataclasses import dataclass, field
from typing import Literal

from actors.lib.reasoning import ReasoningParser, starts_in_reasoning
from actors.lib.tool_calls.sections import ToolCallDelta, ToolCallParser, assemble
from actors.lib.tool_calls.tool_format import ToolFormat


@dataclass(frozen=True)
class ReplyOptions:
    """How a request's replies are read; the default reads nothing."""

    tool_format: ToolFormat | None = None  # None: calls are not read (no tools, or tool_choice none)
    tool_choice: Literal["auto", "required", "named"] = "auto"
    parallel: bool = True
    reasoning_parser: str = "none"
    include_reasoning: bool = True  # vLLM's: False leaves the thinking out of the reply
    think_ids: tuple[int, int] | None = None  # the vocabulary's <think> and </think>, if it has them

    def reader(self, prompt_ids: list[int]) -> "ReplyReader | None":
        if self.tool_format is None and self.reasoning_parser == "none":
            return None
        return ReplyReader(self, prompt_ids)


@dataclass(slots=True)
class ReplyDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


class ReplyReader:
    def __init__(self, options: ReplyOptions, prompt_ids: list[int]) -> None:
        self.options = options
        self._reasoning = None
        if options.reasoning_parser != "none":
            in_reasoning = starts_in_reasoning(options.reasoning_parser, prompt_ids, options.think_ids)
            self._reasoning = ReasoningParser(in_reasoning)
        self._calls = None
        if options.tool_format is not None:
            forced = options.tool_choice != "auto"
            self._calls = ToolCallParser(options.tool_format.syntax, forced, options.parallel)

    def push(self, text: str, final: bool = False) -> ReplyDelta:
        """The reply's next text; `final`: it ends here, so nothing is held back."""
        out = ReplyDelta(content=text)
        if self._reasoning is not None:
            split = self._reasoning.push(text)
            out.reasoning, out.content = split.reasoning, split.content
            if final:
                split = self._reasoning.finish()
                out.reasoning += split.reasoning
                out.content += split.content
        if self._calls is not None:
            parsed = self._calls.push(out.content)
            out.content, out.calls = parsed.content, parsed.calls
            if final:
                parsed = self._calls.finish()
                out.content += parsed.content
                out.calls += parsed.calls
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        """OpenAI's "tool_calls" for a reply that ended by itself after calling (a named function's
        call ends with "stop", as OpenAI's does)."""
        called = self._calls is not None and self._calls.calls > 0
        if reason == "stop" and called and self.options.tool_choice != "named":
            return "tool_calls"
        return reason

    def delta_fields(self, delta: ReplyDelta) -> dict:
        """A stream chunk's `delta`, less the role."""
        fields: dict = {}
        if delta.content:
            fields["content"] = delta.content
        if delta.reasoning and self.options.include_reasoning:
            fields["reasoning_content"] = delta.reasoning
        if delta.calls:
            fields["tool_calls"] = _call_deltas(delta.calls)
        return fields

    def message_fields(self, whole: ReplyDelta) -> dict:
        """A whole reply's `message`, less the role: content is None when the text was all thinking
        or calls, `reasoning_content` is there whenever a reasoning parser reads the reply."""
        moved_out = bool(whole.calls or whole.reasoning)
        fields: dict = {"content": whole.content or (None if moved_out else "")}
        if self._reasoning is not None and self.options.include_reasoning:
            fields["reasoning_content"] = whole.reasoning or None
        if whole.calls:
            fields["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in assemble(whole.calls)
            ]
        return fields


def _call_deltas(calls: list[ToolCallDelta]) -> list[dict]:
    """OpenAI's `delta.tool_calls`: a call's first entry has its index, id, type and name, later
    ones argument fragments; the pieces of one call within a chunk are joined into one entry."""
    entries: list[dict] = []
    for call in calls:
        if entries and entries[-1]["index"] == call.index:
            entries[-1]["function"]["arguments"] += call.arguments
            continue
        entry = {"index": call.index, "function": {"arguments": call.arguments}}
        if call.name is not None:
            entry |= {"id": call.id, "type": "function"}
            entry["function"] = {"name": call.name, "arguments": call.arguments}
        entries.append(entry)
    return entries
