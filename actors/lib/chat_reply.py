"""A chat reply's text read into its parts: the thinking, the answer and the tool calls, whole or
delta by delta, for every door that answers chat requests (the frontdoor's dialects, the gateway's
bus replies), each of which gives the parts in its own shape.

One `ReplyReader` per choice: the thinking is split off first (actors/lib/reasoning.py), then the
answer's calls (actors/lib/tool_calls/). Both decide from the text alone, so a stream's deltas make
up the same parts as the reply read whole. Plain replies (no tools, no reasoning parser) get no
reader and go out as they come.
"""

from dataclasses import dataclass, field
from typing import Literal

from actors.lib.reasoning import ReasoningParser, starts_in_reasoning
from actors.lib.tool_calls.sections import ToolCallDelta, ToolCallParser
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

    @property
    def reads_reasoning(self) -> bool:
        return self._reasoning is not None

    def finish_reason(self, reason: str | None) -> str | None:
        """OpenAI's "tool_calls" for a reply that ended by itself after calling (a named function's
        call ends with "stop", as OpenAI's does)."""
        called = self._calls is not None and self._calls.calls > 0
        if reason == "stop" and called and self.options.tool_choice != "named":
            return "tool_calls"
        return reason
