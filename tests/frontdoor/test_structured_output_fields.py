"""Structured output's fields, OpenAI's, vLLM's and SGLang's, become one `Constraint` that names the
field it came from; a field given wrong, or two constraints at once, is a 400 naming the field. A
schema, regex or grammar that does not parse is refused by a tokenizer's check (tests/e2e)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from actors.frontdoor import openai_protocol as protocol
from actors.frontdoor import sglang_protocol as sglang
from actors.frontdoor.structured_output import choice_grammar, json_schema_constraint
from actors.lib.constraint_grammar import refusal
from schemas.errors import Error
from schemas.generate import Constraint

MODEL = "demo"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def chat(**fields):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]} | fields
    return protocol.parse_chat_request(json.dumps(body).encode(), MODEL)


def completion(**fields):
    return protocol.parse_completion_request(json.dumps({"model": MODEL, "prompt": "hi"} | fields).encode(), MODEL)


def generate(**sampling):
    return sglang.parse_generate_request(json.dumps({"text": "hi", "sampling_params": sampling}).encode())


def constraint_of(parsed) -> Constraint | None:
    assert not isinstance(parsed, Error), parsed
    items = getattr(parsed, "items", None)
    return (items[0].request if items else parsed.request).params.constraint


def assert_invalid(result, param: str, words: str = "") -> None:
    assert isinstance(result, Error), result
    assert (result.code, result.http_status, result.param) == ("invalid_request", 400, param), result
    assert words in result.message, result.message


@pytest.mark.parametrize(
    ("parsed", "expected"),
    [
        (
            chat(
                response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
            ),
            Constraint("json_schema", json.dumps(SCHEMA), "response_format.json_schema.schema"),
        ),
        (chat(response_format={"type": "json_object"}), Constraint("json_object", "", "response_format")),
        (chat(response_format={"type": "text"}), None),
        (completion(response_format={"type": "json_object"}), Constraint("json_object", "", "response_format")),
        (
            chat(structured_outputs={"json": SCHEMA}),
            Constraint("json_schema", json.dumps(SCHEMA), "structured_outputs.json"),
        ),
        (chat(structured_outputs={"regex": "[0-9]+"}), Constraint("regex", "[0-9]+", "structured_outputs.regex")),
        (
            completion(structured_outputs={"choice": ["a", "b"]}),
            Constraint("grammar", choice_grammar(["a", "b"]), "structured_outputs.choice"),
        ),
        (
            chat(structured_outputs={"grammar": 'root ::= "x"'}),
            Constraint("grammar", 'root ::= "x"', "structured_outputs.grammar"),
        ),
        (
            chat(structured_outputs={"json_object": True}),
            Constraint("json_object", "", "structured_outputs.json_object"),
        ),
        (completion(guided_json=json.dumps(SCHEMA)), Constraint("json_schema", json.dumps(SCHEMA), "guided_json")),
        (chat(guided_regex="a|b"), Constraint("regex", "a|b", "guided_regex")),
        (chat(guided_choice=["x", "y"]), Constraint("grammar", choice_grammar(["x", "y"]), "guided_choice")),
        (chat(guided_grammar='root ::= "x"'), Constraint("grammar", 'root ::= "x"', "guided_grammar")),
        (
            generate(json_schema=json.dumps(SCHEMA)),
            Constraint("json_schema", json.dumps(SCHEMA), "sampling_params.json_schema"),
        ),
        (generate(regex="[a-z]+"), Constraint("regex", "[a-z]+", "sampling_params.regex")),
        (generate(ebnf='root ::= "x"'), Constraint("grammar", 'root ::= "x"', "sampling_params.ebnf")),
        (generate(), None),
    ],
)
def test_each_field_becomes_a_constraint_naming_it(parsed, expected):
    assert constraint_of(parsed) == expected


@pytest.mark.parametrize(
    ("parsed", "param", "words"),
    [
        (chat(response_format={"type": "json_schema"}), "response_format.json_schema", "is required"),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "a"}}),
            "response_format.json_schema.schema",
            "is required",
        ),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}),
            "response_format.json_schema.schema",
            "Expected `bool | object`",
        ),
        (
            chat(response_format={"type": "text", "json_schema": {"schema": {}}}),
            "response_format.json_schema",
            "no such",
        ),
        (chat(response_format={"type": "xml"}), "response_format.type", ""),
        (chat(guided_json="{not json"), "guided_json", "not JSON"),
        (chat(guided_choice=[]), "guided_choice", "length >= 1"),
        (chat(response_format={"type": "json_object"}, guided_regex="a"), "guided_regex", "not several"),
        (
            chat(structured_outputs={"regex": "a", "grammar": 'root ::= "a"'}),
            "structured_outputs.grammar",
            "not several",
        ),
        (generate(json_schema="nope"), "sampling_params.json_schema", "not JSON"),
    ],
)
def test_bad_fields_name_the_field(parsed, param, words):
    assert_invalid(parsed, param, words)


@pytest.mark.parametrize(
    ("constraint", "words"),
    [
        (Constraint("json_schema", '{"type": "objec"}', "guided_json"), 'Unsupported type "objec"'),
        (Constraint("regex", "(ab", "guided_regex"), "parenthesis"),
        (Constraint("grammar", "root ::= foo", "guided_grammar"), 'Rule "foo" is not defined'),
        (Constraint("grammar", 'start: "a" "', "guided_grammar"), "not a valid grammar"),
    ],
)
def test_what_does_not_parse_is_refused_naming_its_field(constraint, words):
    """The check a tokenizer makes: xgrammar's own words, without its source file and line."""
    assert_invalid(refusal(constraint), constraint.param, words)
    assert ".cc:" not in refusal(constraint).message


def test_a_schema_for_another_feature_names_its_own_field():
    """The way in for tool calls: a function's parameters as the schema of its arguments."""
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    constraint = json_schema_constraint(parameters, "tools[0].function.parameters")
    assert constraint == Constraint("json_schema", json.dumps(parameters), "tools[0].function.parameters")
    assert refusal(constraint) is None
    assert_invalid(json_schema_constraint(3, "tools[0].function.parameters"), "tools[0].function.parameters")


def test_the_doors_take_these_fields_without_loading_torch():
    """xgrammar brings torch; the frontdoor and the gateway leave the parsing to a tokenizer."""
    code = "import sys, actors.frontdoor.actor, actors.gateway.actor; print(sorted({'torch', 'xgrammar'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
