"""Tool calls read out of JSON as it streams in: one JSON value, a call object
`{"name": ..., "arguments" | "parameters": ...}` or an array of them, fed in pieces of any size.

The section parser (sections.py) runs one scanner per value and turns its events into a reply's
deltas. The structure is checked at the levels that hold calls; inside an argument only strings and
brackets are followed, so the arguments reach the client as the model wrote them, fragment by
fragment, and are never re-serialized. The events of a value do not depend on how it was cut.
"""

import json
import re
from enum import Enum, auto

NAME_KEY = "name"
ARGUMENT_KEYS = ("arguments", "parameters")  # Hermes and Mistral say arguments, Llama 3 parameters
_WHITESPACE = " \t\r\n"
_SCALAR_ENDS = ",}" + _WHITESPACE
_NESTED_STOP = re.compile(r'[{}\[\]"]')  # what matters inside a nested value
_STRING_STOP = re.compile(r'["\\]')  # what ends a run of plain string characters


class Event(Enum):
    CALL = auto()  # a call object opens
    NAME = auto()  # its name, whole (payload: the decoded string)
    ARGUMENTS = auto()  # a fragment of its arguments' text (payload: the text)
    END = auto()  # the call object closes


class Status(Enum):
    OPEN = auto()  # the value goes on past the text fed so far
    DONE = auto()  # the value ended inside the text fed
    INVALID = auto()  # the text is not a value of calls; what it read of the call so far stands


class _Expect(Enum):
    VALUE = auto()  # the start of the whole value
    ELEMENT = auto()  # an array's next element, or its end
    AFTER_ELEMENT = auto()
    KEY = auto()  # a call object's next key, or its end
    COLON = auto()
    MEMBER = auto()  # a key's value
    AFTER_MEMBER = auto()


class CallScanner:
    """Reads one JSON value of calls. `feed` takes the next piece and returns its events, how many
    of its characters belong to the value, and whether the value is still open, done or invalid."""

    def __init__(self) -> None:
        self._stack: list[str] = []  # the open brackets
        self._call_depth = 0  # the depth of the call objects: 1 for a lone object, 2 in an array
        self._expect = _Expect.VALUE
        self._key: str | None = None  # the call-level key whose value is being read
        self._in_string = False
        self._escaped = False
        self._parts: list[str] = []  # the call-level string (key or value) or scalar being read
        self._in_scalar = False
        self._in_arguments = False  # inside an argument object or array: its text goes out raw

    def feed(self, text: str) -> tuple[list[tuple[Event, str]], int, Status]:
        events: list[tuple[Event, str]] = []
        i, n = 0, len(text)
        raw_from = 0 if self._in_arguments else -1  # where the argument text of this piece begins
        while i < n:
            if self._in_string:
                i = self._string(text, i)
                if not self._in_string and len(self._stack) == self._call_depth:
                    self._string_ended(events)
                continue
            if len(self._stack) > self._call_depth:  # inside an argument or another nested value
                i, closed = self._nested(text, i)
                if closed and len(self._stack) == self._call_depth:
                    if self._in_arguments:
                        events.append((Event.ARGUMENTS, text[raw_from:i]))
                        self._in_arguments, raw_from = False, -1
                    self._expect = _Expect.AFTER_MEMBER
                continue
            if self._in_scalar:
                i = self._scalar(text, i, events)
                continue
            char = text[i]
            if char in _WHITESPACE:
                i += 1
                continue
            status = self._structure(char, events)
            if status is Status.INVALID:
                return self._flush(events, text, raw_from, i), i, Status.INVALID
            i += 1
            if self._in_arguments and raw_from < 0:
                raw_from = i - 1  # the argument's opening bracket
            if status is Status.DONE:
                return events, i, Status.DONE
        return self._flush(events, text, raw_from, n), n, Status.OPEN

    def _flush(self, events: list, text: str, raw_from: int, end: int) -> list[tuple[Event, str]]:
        if self._in_arguments and 0 <= raw_from < end:
            events.append((Event.ARGUMENTS, text[raw_from:end]))
        return events

    def _structure(self, char: str, events: list) -> Status | None:
        """A character at a level that holds calls (or at the very start)."""
        expect = self._expect
        if expect is _Expect.VALUE or expect is _Expect.ELEMENT:
            if char == "{":
                self._stack.append("{")
                self._call_depth = self._call_depth or 1
                self._expect = _Expect.KEY
                events.append((Event.CALL, ""))
                return None
            if expect is _Expect.VALUE and char == "[":
                self._stack.append("[")
                self._call_depth = 2
                self._expect = _Expect.ELEMENT
                return None
            if expect is _Expect.ELEMENT and char == "]":
                return self._close()
            return Status.INVALID
        if expect is _Expect.AFTER_ELEMENT:
            if char == ",":
                self._expect = _Expect.ELEMENT
                return None
            return self._close() if char == "]" else Status.INVALID
        if expect is _Expect.KEY:
            if char == '"':
                self._in_string, self._parts, self._key = True, [], None
                return None
            if char == "}":
                events.append((Event.END, ""))
                return self._close()
            return Status.INVALID
        if expect is _Expect.COLON:
            if char == ":":
                self._expect = _Expect.MEMBER
                return None
            return Status.INVALID
        if expect is _Expect.MEMBER:
            if char == '"':
                self._in_string, self._parts = True, []
            elif char in "{[":
                self._stack.append(char)
                self._in_arguments = self._key in ARGUMENT_KEYS
            elif char in "}],:":
                return Status.INVALID
            else:
                self._in_scalar, self._parts = True, [char]
            return None
        # AFTER_MEMBER
        if char == ",":
            self._expect = _Expect.KEY
            return None
        if char == "}":
            events.append((Event.END, ""))
            return self._close()
        return Status.INVALID

    def _close(self) -> Status | None:
        self._stack.pop()
        if not self._stack:
            return Status.DONE
        self._expect = _Expect.AFTER_ELEMENT
        return None

    def _string(self, text: str, i: int) -> int:
        """Reads string characters from i; returns where it stopped (past the closing quote, if any)."""
        start = i
        if self._escaped:
            self._escaped = False
            i += 1
        while i < len(text):
            match = _STRING_STOP.search(text, i)
            if match is None:
                i = len(text)
                break
            stop = match.start()
            if text[stop] == "\\":
                if stop + 1 >= len(text):
                    self._escaped, i = True, len(text)
                    break
                i = stop + 2
                continue
            self._in_string = False
            if len(self._stack) == self._call_depth:
                self._parts.append(text[start:stop])
            return stop + 1
        if len(self._stack) == self._call_depth:
            self._parts.append(text[start:i])
        return i

    def _string_ended(self, events: list) -> None:
        raw = "".join(self._parts)
        if self._expect is _Expect.KEY:
            self._key = _decoded(raw)
            self._expect = _Expect.COLON
            return
        value = _decoded(raw)
        if self._key == NAME_KEY:
            events.append((Event.NAME, value))
        elif self._key in ARGUMENT_KEYS:
            events.append((Event.ARGUMENTS, value))  # arguments sent as a JSON string: its content
        self._expect = _Expect.AFTER_MEMBER

    def _nested(self, text: str, i: int) -> tuple[int, bool]:
        """One step inside a nested value, to a string's start or a bracket. Returns the next
        position and whether a bracket closed."""
        while (match := _NESTED_STOP.search(text, i)) is not None:
            char, i = match.group(), match.end()
            if char == '"':
                self._in_string = True
                return i, False
            if char in "]}":
                self._stack.pop()
                return i, True
            self._stack.append(char)
        return len(text), False

    def _scalar(self, text: str, i: int, events: list) -> int:
        start = i
        while i < len(text) and text[i] not in _SCALAR_ENDS:
            i += 1
        self._parts.append(text[start:i])
        if i < len(text):
            self._in_scalar = False
            value = "".join(self._parts)
            if self._key in ARGUMENT_KEYS and value != "null":
                events.append((Event.ARGUMENTS, value))
            self._expect = _Expect.AFTER_MEMBER
        return i


def _decoded(raw: str) -> str:
    """A JSON string's content, its escapes undone (as written, if they are not valid JSON)."""
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return raw
