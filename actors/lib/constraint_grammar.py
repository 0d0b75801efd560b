"""A request's `Constraint` (schemas/generate.py) as an xgrammar `Grammar`: the one reading of its
kinds, shared by the tokenizer, which checks a constraint when its request arrives (so a bad schema,
regex or grammar is the client's 400 before anything runs), and the executor, which compiles it
for the served vocabulary (actors/executor/grammars.py).
"""

import json
import re
from typing import TYPE_CHECKING

from schemas.errors import Error
from schemas.generate import Constraint

if TYPE_CHECKING:
    # Imported where a grammar is made: xgrammar pulls in torch and transformers, some 3 s of CPU that
    # every start of the tokenizer paid for a feature most servers never use. The first constrained
    # request pays it once instead, on a worker thread (as vLLM's grammar backend is made lazily).
    import xgrammar

# JSON without free whitespace: a model cannot pad its output with blanks until max_tokens.
# xgrammar then writes items apart by ", " and keys from values by ": ", as json.dumps does.
JSON_WHITESPACE = False
# Any JSON object, as OpenAI's json_object means it (and vLLM compiles it).
ANY_OBJECT = '{"type": "object"}'
# The characters of a JSON string as xgrammar (0.2.8) prints them: unbounded, then bounded by
# minLength or maxLength; and JSON's own, without the surrogates, which no UTF-8 decoder reads.
_XGRAMMAR_STRING_CHARACTERS = (r"[^\0-\x1f\"\\\r\n]", r"[^\"\\\r\n]")
_JSON_STRING_CHARACTER = r"[^\0-\x1f\"\\\ud800-\udfff]"
# xgrammar's errors start with the time and its source file and line: "[10:23:37] /x/y.cc:83: ".
_XGRAMMAR_PREFIX = re.compile(r"^\s*(\[[0-9:.]+\]\s*)?\S+\.(cc|h):\d+:\s*")


class ConstraintError(ValueError):
    """A constraint that is no grammar: its text, in words a client can act on."""


def grammar_of(constraint: Constraint) -> "xgrammar.Grammar":
    """The grammar of `constraint`; raises ConstraintError naming what is wrong with it."""
    import xgrammar

    try:
        match constraint.kind:
            case "json_schema":
                return _json_strings(
                    xgrammar.Grammar.from_json_schema(
                        _json_text(constraint.text), any_whitespace=JSON_WHITESPACE, strict_mode=True
                    )
                )
            case "json_object":
                return _json_strings(
                    xgrammar.Grammar.from_json_schema(ANY_OBJECT, any_whitespace=JSON_WHITESPACE, strict_mode=False)
                )
            case "regex":
                return xgrammar.Grammar.from_regex(constraint.text)
            case "grammar" if "::=" in constraint.text:
                return xgrammar.Grammar.from_ebnf(constraint.text)
            case "grammar":  # no `::=`: Lark's notation, as vLLM tells the two apart
                return xgrammar.Grammar.from_lark(constraint.text)
            case "structural_tag":
                return xgrammar.Grammar.from_structural_tag(constraint.text)
    except UnicodeDecodeError:  # xgrammar's own message about the text, cut inside a character
        raise ConstraintError(f"not a valid {_NAMES[constraint.kind]}") from None
    except RuntimeError as exc:  # xgrammar's parsers raise these
        raise ConstraintError(f"not a valid {_NAMES[constraint.kind]}: {_xgrammar_message(exc)}") from None
    except RecursionError:
        raise ConstraintError(f"the {_NAMES[constraint.kind]} is nested too deeply") from None
    raise ConstraintError(f"unknown constraint kind {constraint.kind!r}")


def refusal(constraint: Constraint) -> Error | None:
    """Why `constraint` cannot be followed, as the `Error` a client gets (naming its field); None if it can."""
    try:
        grammar_of(constraint)
    except ConstraintError as exc:
        return Error("invalid_request", str(exc), param=constraint.param)
    return None


def _json_text(text: str) -> str:
    """The schema, checked to be JSON first: xgrammar's own complaint about a non-JSON text quotes it whole."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"the JSON schema is not JSON: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise ConstraintError(f"a JSON schema is an object or a boolean, not {type(schema).__name__}")
    return text


def _json_strings(grammar: "xgrammar.Grammar") -> "xgrammar.Grammar":
    """`grammar` with JSON's characters in every string, which xgrammar (0.2.8) writes more loosely:
    it lets UTF-8-encoded surrogates into every string (a decoder reads them as U+FFFD, one per byte,
    so a string may decode longer than its maxLength), and the control characters other than CR and
    LF into a string with minLength or maxLength, which JSON forbids. A random-weight model draws both."""
    text = str(grammar)
    loose = [characters for characters in _XGRAMMAR_STRING_CHARACTERS if characters in text]
    for characters in loose:
        text = text.replace(characters, _JSON_STRING_CHARACTER)
    import xgrammar

    return xgrammar.Grammar.from_ebnf(text) if loose else grammar


def _xgrammar_message(exc: RuntimeError) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return _XGRAMMAR_PREFIX.sub("", lines[0] if lines else "").strip() or type(exc).__name__


_NAMES = {
    "json_schema": "JSON schema",
    "json_object": "JSON object",
    "regex": "regex",
    "grammar": "grammar",
    "structural_tag": "tool-call grammar (a tool's parameters schema)",
}
