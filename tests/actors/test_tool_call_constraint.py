"""The grammar of a demanded call: xgrammar compiles it, it takes the family's own text of valid
calls and refuses others, and what it takes, the family's parser reads back as those calls."""

import json

import pytest
import xgrammar
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.lib.constraint_grammar import refusal
from actors.lib.tool_calls.constraint import tool_call_constraint, tool_call_schema
from actors.lib.tool_calls.families import FORMATS
from actors.lib.tool_calls.sections import assemble, parse_whole
from schemas.generate import Constraint

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: any object
TOOLS = [WEATHER, TIME]
NAMED = {"type": "function", "function": {"name": "get_weather"}}

_compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), cache_enabled=False)


def accepts(grammar: xgrammar.Grammar, text: str) -> bool:
    """Whether the grammar takes `text` whole (a matcher over characters, no vocabulary)."""
    matcher = xgrammar.GrammarMatcher(_compiler.compile_grammar(grammar), terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def reply(fmt, calls: list[tuple[str, dict]]) -> str:
    """The family's text of `calls`, as a constrained reply writes it."""
    body = fmt.separator.join(fmt.call_begin(name) + json.dumps(args) + fmt.call_end for name, args in calls)
    return fmt.before + body + fmt.after


def grammar_of(fmt, tool_choice, parallel=True, reasoning="none") -> xgrammar.Grammar:
    constraint = tool_call_constraint(fmt, TOOLS, tool_choice, parallel, reasoning)
    return xgrammar.Grammar.from_structural_tag(json.dumps(constraint.structural_tag))


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_required_takes_valid_calls_and_the_parser_reads_them(fmt):
    grammar = grammar_of(fmt, "required")
    calls = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "UTC"})]
    for some in (calls[:1], calls):
        text = reply(fmt, some)
        assert accepts(grammar, text), text
        parsed = parse_whole(fmt.syntax, text, forced=True)
        assert parsed.content == ""
        assert [(c.name, json.loads(c.arguments)) for c in assemble(parsed.calls)] == some
    for bad in (
        "",  # a call is required
        "Sure! " + reply(fmt, calls[:1]),  # nothing but calls
        reply(fmt, [("get_weather", {"city": "Paris"})]),  # days is required
        reply(fmt, [("get_weather", {"city": "Paris", "days": 0})]),  # days >= 1
        reply(fmt, [("launch", {})]),  # not a tool
    ):
        assert not accepts(grammar, bad), bad


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_a_named_function_or_no_parallel_calls_take_exactly_one(fmt):
    one, two = [("get_weather", {"city": "Oslo", "days": 1})], [("get_weather", {"city": "Oslo", "days": 1})] * 2
    for grammar in (grammar_of(fmt, NAMED), grammar_of(fmt, "required", parallel=False)):
        assert accepts(grammar, reply(fmt, one))
        assert not accepts(grammar, reply(fmt, two))
    assert not accepts(grammar_of(fmt, NAMED), reply(fmt, [("get_time", {})]))


def test_thinking_comes_first_where_the_model_reasons():
    fmt = FORMATS["hermes"]
    call = reply(fmt, [("get_time", {})])
    optional, opened = grammar_of(fmt, "required", reasoning="optional"), grammar_of(fmt, "required", reasoning="open")
    assert accepts(optional, call) and accepts(optional, "<think>Which tool?</think>\n\n" + call)
    assert accepts(opened, "Which tool?</think>\n\n" + call) and not accepts(opened, call)


def test_auto_and_none_are_not_constrained():
    for choice in ("auto", "none", None):
        assert tool_call_constraint(FORMATS["hermes"], TOOLS, choice, True) is None


def test_the_json_schema_is_the_calls_as_an_array():
    schema = tool_call_schema(TOOLS, "required", parallel=True)
    grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema))
    assert accepts(grammar, json.dumps([{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}]))
    assert accepts(grammar, json.dumps([{"name": "get_time", "arguments": {}}] * 2))
    assert not accepts(grammar, "[]")
    named = xgrammar.Grammar.from_json_schema(json.dumps(tool_call_schema(TOOLS, NAMED, parallel=True)))
    assert not accepts(named, json.dumps([{"name": "get_time", "arguments": {}}]))


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(list(FORMATS.values())),
    calls=st.lists(st.tuples(st.text(max_size=12), st.integers(min_value=1, max_value=10**6)), min_size=1, max_size=3),
)
def test_any_valid_arguments_pass_the_grammar_and_parse_back(fmt, calls):
    calls = [("get_weather", {"city": city, "days": days}) for city, days in calls]
    text = reply(fmt, calls)
    assert accepts(grammar_of(fmt, "required"), text)
    parsed = assemble(parse_whole(fmt.syntax, text, forced=True).calls)
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls


def test_a_schema_xgrammar_cannot_use_is_refused_naming_the_tools():
    """The tokenizer's check of the request's constraint: the demanded call's grammar."""
    fmt = FORMATS["hermes"]
    good = tool_call_constraint(fmt, [WEATHER], "required", True, "none").structural_tag
    assert refusal(Constraint("structural_tag", json.dumps(good), "tools")) is None
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}
    bad = tool_call_constraint(fmt, [bad_tool], "required", True, "none").structural_tag
    error = refusal(Constraint("structural_tag", json.dumps(bad), "tools"))
    assert error is not None and error.param == "tools" and "objectx" in error.message
