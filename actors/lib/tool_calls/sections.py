"""A reply's text split into content and tool calls as it streams in, for any format whose calls
are JSON: each family (hermes.py, llama3_json.py, mistral.py) only says how its calls are marked.

A call section opens at the family's marker (or, for some, with JSON at the very start of the
reply) and holds one or more JSON values of calls (json_calls.py). The parser decides from the text
alone, never from where it was cut: text that could still be the start of a marker waits, as does
whitespace that may come right before one, so every way of cutting a reply gives the same content
and calls as the reply whole (`parse_whole` is one push and the finish). A section that turns out
to hold no call before anything of it went out (the marker followed by prose, JSON without a name)
is content after all, marker included. Once a call's name has gone out the call stands; the rest of
a section that breaks off after that is dropped up to its closing marker.
"""

import secrets
from dataclasses import dataclass, field

from actors.lib.markers import partial_suffix
from actors.lib.tool_calls.json_calls import CallScanner, Event, Status

_WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class CallSyntax:
    """How one family marks its calls in text."""

    opener: str  # opens a section anywhere in the reply
    closer: str | None = None  # closes it; None: a section ends where its JSON does
    json_at_start: bool = False  # JSON at the very start of the reply is a section too
    separators: str = ","  # what may stand between two values of a section, beside whitespace


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of one call: its first carries the id and name, the later ones argument text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class ParsedDelta:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI gives it


@dataclass
class _Call:
    name: str | None = None
    index: int = -1  # its place among the reply's calls, once started; -1: not (yet) sent
    dropped: bool = False  # a call past the first when parallel calls are off
    pending: list[str] = field(default_factory=list)  # argument text that came before the name
    has_arguments: bool = False


@dataclass
class _Section:
    replay: str  # the text before it that is content if the section turns out to hold no call
    raw: list[str] = field(default_factory=list)  # its text so far, while nothing of it went out
    committed: bool = False  # a call of it went out
    dropping: bool = False  # what broke off it after a call went out is skipped, up to its closer
    scanner: CallScanner | None = None  # the value being read; None between values
    call: _Call | None = None


class ToolCallParser:
    """One reply's text in, `ParsedDelta`s out. `forced`: the request demands a call (tool_choice
    required or a named function), so JSON at the start is read as calls whatever the family.
    `parallel`: False keeps only the first call."""

    def __init__(self, syntax: CallSyntax, forced: bool = False, parallel: bool = True) -> None:
        self._syntax = syntax
        self._json_at_start = syntax.json_at_start or forced
        self._parallel = parallel
        self._text = ""  # received, not yet decided
        self._at_start = True  # nothing but whitespace so far
        self._skip_space = False  # whitespace right after a section is not content
        self._section: _Section | None = None
        self.calls = 0  # calls started

    def push(self, text: str) -> ParsedDelta:
        self._text += text
        return self._run(final=False)

    def finish(self) -> ParsedDelta:
        """The reply ended: what was held back is decided."""
        return self._run(final=True)

    def _run(self, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        while self._step(out, final) if self._section is None else self._section_step(out, final):
            pass
        return out

    # --- outside sections ---

    def _step(self, out: ParsedDelta, final: bool) -> bool:
        text = self._text
        if self._skip_space:
            text = text.lstrip(_WHITESPACE)
            if not text:
                self._text = "" if final else self._text
                return False
            self._skip_space = False
        if self._at_start and self._json_at_start:
            rest = text.lstrip(_WHITESPACE)
            if not rest and not final:
                self._text = text
                return False
            if rest[:1] in ("{", "["):
                self._at_start = False
                self._open(text[: len(text) - len(rest)], rest)
                return True
        opener = self._syntax.opener
        at = text.find(opener)
        if at >= 0:
            before = text[:at]
            kept = before.rstrip(_WHITESPACE)
            out.content += kept
            self._at_start = False
            self._open(before[len(kept) :] + opener, text[at + len(opener) :])
            return True
        if final:
            out.content += text
            self._text = ""
            return False
        # Hold what could still start a marker, and the whitespace before it.
        cut = len(text) - partial_suffix(text, opener)
        cut = len(text[:cut].rstrip(_WHITESPACE))
        if cut:
            self._at_start = False
        out.content += text[:cut]
        self._text = text[cut:]
        return False

    def _open(self, replay: str, rest: str) -> None:
        self._section = _Section(replay)
        self._text = rest

    # --- inside a section ---

    def _section_step(self, out: ParsedDelta, final: bool) -> bool:
        section = self._section
        if section.scanner is not None:
            return self._read_value(section, out, final)
        if section.dropping:
            return self._drop_to_closer(section, out, final)
        text = self._text
        rest = text.lstrip(_WHITESPACE + self._syntax.separators)
        self._keep(section, text[: len(text) - len(rest)])
        self._text = rest
        closer = self._syntax.closer
        if not rest:
            if final:
                self._end(out)
            return final
        if closer and rest.startswith(closer):
            self._keep(section, closer)
            self._text = rest[len(closer) :]
            self._end(out)
            return True
        if closer and closer.startswith(rest) and not final:
            return False
        if rest[0] in "{[":
            section.scanner = CallScanner()
            return True
        if section.committed and closer:  # what breaks off a section that went out is dropped
            section.dropping = True
            return True
        self._end(out)
        return True

    def _drop_to_closer(self, section: _Section, out: ParsedDelta, final: bool) -> bool:
        """Skips text up to the section's closer, across pushes: a brace in the skipped text starts no
        call, however the reply was cut into pieces."""
        text, closer = self._text, self._syntax.closer
        at = text.find(closer)
        if at < 0:
            self._text = "" if final else text[len(text) - partial_suffix(text, closer) :]
            if final:
                self._end(out)
            return final
        section.dropping = False
        self._text = text[at:]
        return True

    def _read_value(self, section: _Section, out: ParsedDelta, final: bool) -> bool:
        text = self._text
        events, used, status = section.scanner.feed(text)
        self._keep(section, text[:used])
        self._text = text[used:]
        for event, payload in events:
            if not self._on_event(section, event, payload, out):
                self._abandon(out)
                return True
        if status is Status.OPEN:
            if final:
                self._end(out)
            return final
        section.scanner = None
        if status is Status.INVALID:
            self._close_call(section, out)
            if not section.committed:
                self._abandon(out)
        return True

    def _on_event(self, section: _Section, event: Event, payload: str, out: ParsedDelta) -> bool:
        """False: the section holds something that is not a call, and nothing of it went out."""
        call = section.call
        if event is Event.CALL:
            section.call = _Call()
        elif event is Event.NAME:
            if call.name is None:
                call.name = payload
                self._start_call(section, call, out)
        elif event is Event.ARGUMENTS:
            call.has_arguments = True
            if call.index >= 0:
                out.calls.append(ToolCallDelta(call.index, arguments=payload))
            elif call.name is None:
                call.pending.append(payload)
        elif event is Event.END:
            if call.name is None and not section.committed:
                return False
            self._close_call(section, out)
        return True

    def _start_call(self, section: _Section, call: _Call, out: ParsedDelta) -> None:
        section.committed = True
        section.raw = []
        if self.calls and not self._parallel:
            call.dropped = True
            return
        call.index = self.calls
        self.calls += 1
        out.calls.append(ToolCallDelta(call.index, "call_" + secrets.token_hex(12), call.name))
        if call.pending:
            out.calls.append(ToolCallDelta(call.index, arguments="".join(call.pending)))
            call.pending = []

    def _close_call(self, section: _Section, out: ParsedDelta) -> None:
        call, section.call = section.call, None
        if call is not None and call.index >= 0 and not call.has_arguments:
            out.calls.append(ToolCallDelta(call.index, arguments="{}"))

    def _end(self, out: ParsedDelta) -> None:
        section = self._section
        self._close_call(section, out)
        if not section.committed:
            self._abandon(out)
            return
        self._section = None
        self._skip_space = True

    def _abandon(self, out: ParsedDelta) -> None:
        """The section was content after all: its marker goes out as text, and what followed it is
        read again as text (it may hold another section)."""
        section, self._section = self._section, None
        out.content += section.replay
        self._text = "".join(section.raw) + self._text

    @staticmethod
    def _keep(section: _Section, text: str) -> None:
        if not section.committed and text:
            section.raw.append(text)


def parse_whole(syntax: CallSyntax, text: str, forced: bool = False, parallel: bool = True) -> ParsedDelta:
    parser = ToolCallParser(syntax, forced, parallel)
    delta = parser.push(text)
    end = parser.finish()
    delta.content += end.content
    delta.calls += end.calls
    return delta


def assemble(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """The calls that a run of deltas (of one reply, in order) makes up."""
    calls: dict[int, list] = {}
    for delta in deltas:
        if delta.name is not None:
            calls[delta.index] = [delta.id, delta.name, [delta.arguments]]
        else:
            calls[delta.index][2].append(delta.arguments)
    return [ToolCall(cid, name, "".join(args)) for cid, name, args in (calls[i] for i in sorted(calls))]
