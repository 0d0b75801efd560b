"""Structured output's request fields, as one `Constraint` (schemas/generate.py) that names the field
it came from: OpenAI's `response_format`, vLLM's `structured_outputs` and its older `guided_json`,
`guided_regex`, `guided_choice` and `guided_grammar`, and SGLang's `json_schema`, `regex` and `ebnf`
sampling params. No I/O, and no xgrammar (which would bring torch into the frontdoor): whether the
schema, regex or grammar parses, a tokenizer checks when the request arrives
(actors/lib/constraint_grammar.py), so the client's 400 comes before anything runs.

`json_schema_constraint` is the way in for other features that constrain decoding by a schema (a
tool call whose arguments must match its function's parameters).
"""

import json
from typing import Any, Literal

import msgspec

from schemas.errors import Error
from schemas.generate import Constraint


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    """`response_format.json_schema`. Every schema is followed strictly (no properties it does not
    name), as `strict: true` asks; `name` and `description` only label it."""

    name: str | None = None
    schema: Any = None  # a JSON schema: an object (or a boolean)
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(msgspec.Struct, kw_only=True):
    """vLLM's `structured_outputs`: one of these."""

    json: Any = None  # a JSON schema, as an object or as its JSON text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # EBNF (xgrammar's), or Lark
    json_object: bool | None = None


def json_schema_constraint(schema: Any, param: str) -> Constraint | Error:
    """Decoding that writes a JSON value valid under `schema` (a decoded JSON schema: an object or a
    boolean, or its JSON text); `param` names the field an error about the schema names."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            return invalid(f"the JSON schema is not JSON: {exc}", param)
    if not isinstance(schema, dict | bool):
        return invalid(f"a JSON schema is an object or a boolean, not {type(schema).__name__}", param)
    return Constraint("json_schema", json.dumps(schema, ensure_ascii=False), param)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose sentences are exactly `choices` (vLLM's guided_choice). A JSON string
    literal is an EBNF string literal of xgrammar's, escapes included."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)


def openai_constraint(
    response_format: ResponseFormat | None,
    structured_outputs: StructuredOutputs | None,
    guided: dict[str, Any],
) -> Constraint | None | Error:
    """The constraint of an OpenAI body: `response_format`, vLLM's `structured_outputs`, or its
    `guided_*` fields (`guided`: each given one by name); at most one of them. None: none."""
    asked: list[Constraint | Error] = []
    if response_format is not None and response_format.type != "text":
        asked.append(_response_format(response_format))
    if structured_outputs is not None:
        fields = msgspec.structs.asdict(structured_outputs).items()
        given = {name: value for name, value in fields if value is not None and value is not False}
        asked += [_vllm(name, value, f"structured_outputs.{name}") for name, value in given.items()]
    asked += [_vllm(name.removeprefix("guided_"), value, name) for name, value in guided.items() if value is not None]
    return _one(asked)


def sglang_constraint(json_schema: Any, regex: str | None, ebnf: str | None) -> Constraint | None | Error:
    """The constraint of SGLang's `sampling_params` (`json_schema`: the schema's JSON text, or the schema)."""
    prefix = "sampling_params."
    asked: list[Constraint | Error] = []
    if json_schema is not None:
        asked.append(json_schema_constraint(json_schema, prefix + "json_schema"))
    if regex is not None:
        asked.append(Constraint("regex", regex, prefix + "regex"))
    if ebnf is not None:
        asked.append(Constraint("grammar", ebnf, prefix + "ebnf"))
    return _one(asked)


def _response_format(response_format: ResponseFormat) -> Constraint | Error:
    if response_format.type == "json_object":
        return Constraint("json_object", param="response_format")
    if response_format.json_schema is None or response_format.json_schema.schema is None:
        return invalid("a json_schema response_format needs json_schema.schema", "response_format.json_schema.schema")
    return json_schema_constraint(response_format.json_schema.schema, "response_format.json_schema.schema")


def _vllm(kind: str, value: Any, param: str) -> Constraint | Error:
    """One of vLLM's fields: `kind` json, regex, choice, grammar or json_object."""
    match kind:
        case "json":
            return json_schema_constraint(value, param)
        case "json_object":
            return Constraint("json_object", param=param)
        case "choice" if not value:
            return invalid("choice needs at least one string", param)
        case "choice":
            return Constraint("grammar", choice_grammar(value), param)
        case "regex":
            return Constraint("regex", value, param)
        case _:
            return Constraint("grammar", value, param)


def _one(asked: list[Constraint | Error]) -> Constraint | None | Error:
    if len(asked) > 1:
        names = ", ".join(c.param for c in asked if isinstance(c, Constraint))
        return invalid(f"give one structured output constraint, not several ({names})", asked[1].param)
    return asked[0] if asked else None


def invalid(message: str, param: str) -> Error:
    return Error("invalid_request", message, param=param)
