"""A chat reply's parts (actors/lib/chat_reply.py) in OpenAI's shapes: a whole reply's `message`
and a stream chunk's `delta`, with `reasoning_content` and `tool_calls` beside `content`."""

from actors.lib.chat_reply import ReplyDelta, ReplyReader
from actors.lib.tool_calls.sections import ToolCallDelta, assemble


def delta_fields(reader: ReplyReader, delta: ReplyDelta) -> dict:
    """A stream chunk's `delta`, less the role."""
    fields: dict = {}
    if delta.content:
        fields["content"] = delta.content
    if delta.reasoning and reader.options.include_reasoning:
        fields["reasoning_content"] = delta.reasoning
    if delta.calls:
        fields["tool_calls"] = _call_deltas(delta.calls)
    return fields


def message_fields(reader: ReplyReader, whole: ReplyDelta) -> dict:
    """A whole reply's `message`, less the role: content is None when the text was all thinking
    or calls, `reasoning_content` is there whenever a reasoning parser reads the reply."""
    moved_out = bool(whole.calls or whole.reasoning)
    fields: dict = {"content": whole.content or (None if moved_out else "")}
    if reader.reads_reasoning and reader.options.include_reasoning:
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
