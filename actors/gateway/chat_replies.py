"""A bus chat request's tool fields and replies, as the HTTP chat route takes and reads them: the
same check of `chat_template`'s `tools`, `tool_choice` and `parallel_tool_calls`
(actors/lib/chat_tools.py, errors naming `chat_template.<field>`), so "required" or a named
function decodes the reply under the call's grammar, and the same reader (actors/lib/chat_reply.py)
with the server's one `ChatFormat`, so the thinking goes to `reasoning_content`, the calls to
`tool_calls` and `text` keeps the answer alone, whole and chunk by chunk, and any cut of the stream
gives the reply read whole. Requests with `text` or `input_ids` are no chat: their text goes out as
it came.
"""

from dataclasses import dataclass, field

import msgspec

from actors.lib.chat_format import ChatFormat
from actors.lib.chat_reply import ReplyOptions, ReplyReader
from actors.lib.chat_tools import ToolParams, chat_tools
from actors.lib.tool_calls.sections import ToolCallDelta, assemble
from schemas.errors import Error
from schemas.generate import ChatTemplateArgs, ChatToolCall, ChatToolCallDelta, GenerateRequest, ToolCallFunction

BUS_PARAMS = ToolParams(
    tools="chat_template.tools", tool_choice="chat_template.tool_choice", kwargs="chat_template.kwargs"
)


def chat_request(request: GenerateRequest, chat_format: ChatFormat) -> tuple[GenerateRequest, ReplyOptions] | Error:
    """The request as the pipeline takes it (the tools offered, a demanded call's grammar), and how
    its replies are read; a request that is no chat goes as it came, its replies read as nothing."""
    if request.messages is None:
        return request, ReplyOptions()
    tools = chat_tools(request.chat_template or ChatTemplateArgs(), chat_format, BUS_PARAMS)
    if isinstance(tools, Error):
        return tools
    applied = tools.applied(request, BUS_PARAMS)
    return applied if isinstance(applied, Error) else (applied, tools.reply)


@dataclass(frozen=True)
class ChunkParts:
    """What one output adds to a chunk."""

    text: str
    reasoning_content: str = ""
    tool_calls: list[ChatToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.text or self.reasoning_content or self.tool_calls)


class ChoiceReply:
    """One choice's reply as it comes in: each output's parts for its chunk, and the whole for the
    result. `reader` None: the text as it came."""

    def __init__(self, reader: ReplyReader | None) -> None:
        self._reader = reader
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCallDelta] = []

    def add(self, text: str, final: bool) -> ChunkParts:
        """`final`: the reply ends with this output, so nothing is held back."""
        if self._reader is None:
            self._text.append(text)
            return ChunkParts(text)
        delta = self._reader.push(text, final)
        self._text.append(delta.content)
        self._reasoning.append(delta.reasoning)
        self._calls += delta.calls
        return ChunkParts(delta.content, delta.reasoning, _call_deltas(delta.calls))

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning_content(self) -> str:
        return "".join(self._reasoning)

    def tool_calls(self) -> list[ChatToolCall]:
        return [ChatToolCall(c.id, ToolCallFunction(c.name, _arguments(c.arguments))) for c in assemble(self._calls)]

    def finish_reason(self, reason: str) -> str:
        """ "tool_calls" for a reply that called and ended by itself."""
        return reason if self._reader is None else self._reader.finish_reason(reason)


def _call_deltas(calls: list[ToolCallDelta]) -> list[ChatToolCallDelta]:
    """The pieces of one call that came with one output, joined."""
    joined: list[list] = []
    for call in calls:
        if joined and joined[-1][0] == call.index:
            joined[-1][3] += call.arguments
        else:
            joined.append([call.index, call.id, call.name, call.arguments])
    return [ChatToolCallDelta(*piece) for piece in joined]


def _arguments(text: str):
    """Decoded, as a request's history takes them; the text itself when it is no whole JSON (a
    call that `max_tokens` cut short)."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text
