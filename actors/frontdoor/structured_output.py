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
from typing import Annotated, Any

import msgspec

from schemas.errors import Error
from schemas.generate import Constraint

# A JSON schema as JSON Schema allows one: an object or a boolean. Whether xgrammar can follow it, a
# tokenizer checks (the schema language cannot say).
JsonSchema = dict[str, Any] | bool


class JsonSchemaFormat(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`response_format.json_schema`. Every schema is followed strictly (no properties it does not
    name), as `strict: true` asks, so `strict` changes nothing; `name` and `description` only label it."""

    name: str | None = None
    schema: JsonSchema
    strict: bool | None = None
    description: str | None = None


class TextFormat(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    """Free text: no constraint."""


class JsonObjectFormat(msgspec.Struct, tag_field="type", tag="json_object", forbid_unknown_fields=True):
    """Any JSON object."""


class JsonSchemaResponseFormat(msgspec.Struct, tag_field="type", tag="json_schema", forbid_unknown_fields=True):
    json_schema: JsonSchemaFormat


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat
Choices = Annotated[list[str], msgspec.Meta(min_length=1)]


class StructuredOutputs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `structured_outputs`: one of these."""

    json: JsonSchema | str | None = None  # a JSON schema, or its JSON text
    regex: str | None = None
    choice: Choices | None = None
    grammar: str | None = None  # EBNF (xgrammar's), or Lark
    json_object: bool | None = None  # false: none


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
    if isinstance(response_format, JsonObjectFormat):
        asked.append(Constraint("json_object", param="response_format"))
    elif isinstance(response_format, JsonSchemaResponseFormat):
        schema = response_format.json_schema.schema
        asked.append(json_schema_constraint(schema, "response_format.json_schema.schema"))
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


def _vllm(kind: str, value: Any, param: str) -> Constraint | Error:
    """One of vLLM's fields: `kind` json, regex, choice, grammar or json_object."""
    match kind:
        case "json":
            return json_schema_constraint(value, param)
        case "json_object":
            return Constraint("json_object", param=param)
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
