"""The tool-call parsers of each family: what a whole reply gives, and that every cut of the same
text, streamed, gives the same content and calls, with no marker leaked into the content."""

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from actors.lib.tool_calls import hermes, llama3_json, mistral
from actors.lib.tool_calls.families import FORMATS, chat_template_text, detect, tool_format
from actors.lib.tool_calls.sections import ToolCallParser, assemble, parse_whole

HERMES, LLAMA, MISTRAL = hermes.FORMAT, llama3_json.FORMAT, mistral.FORMAT


def whole(fmt, text, **options):
    parsed = parse_whole(fmt.syntax, text, **options)
    return parsed.content, [(c.name, c.arguments) for c in assemble(parsed.calls)]


def streamed(fmt, text, cuts, **options):
    """The text pushed in pieces cut at `cuts`; checks the deltas' shape on the way."""
    parser = ToolCallParser(fmt.syntax, **options)
    content, deltas = "", []
    bounds = [0, *sorted(set(cuts)), len(text)]
    for start, end in zip(bounds, bounds[1:]):
        delta = parser.push(text[start:end])
        content += delta.content
        deltas += delta.calls
    end = parser.finish()
    content += end.content
    deltas += end.calls
    started = set()
    for delta in deltas:  # a call's first delta names it, the later ones carry arguments only
        if delta.index not in started:
            assert delta.name is not None and delta.id.startswith("call_")
            started.add(delta.index)
        else:
            assert delta.name is None and delta.id is None
    assert sorted(started) == list(range(len(started)))
    return content, [(c.name, c.arguments) for c in assemble(deltas)]


# --- whole replies ---------------------------------------------------------------------------


def test_hermes_calls_and_the_text_before_them():
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, {"a": "}"}]}}\n</tool_call>\n'
        '<tool_call>\n{"arguments": {"q": "a\\"b"}, "name": "search"}\n</tool_call>'
    )
    content, calls = whole(HERMES, text)
    assert content == "Let me check."
    assert calls == [("get_weather", '{"city": "Paris", "days": [1, {"a": "}"}]}'), ("search", '{"q": "a\\"b"}')]
    assert json.loads(calls[1][1]) == {"q": 'a"b'}


def test_arguments_are_the_model_s_own_text_or_a_decoded_string():
    assert whole(HERMES, '<tool_call>{"name":"f","arguments":{ "a" :1 }}</tool_call>')[1] == [("f", '{ "a" :1 }')]
    assert whole(HERMES, '<tool_call>{"name":"f","arguments":"{\\"a\\": 1}"}</tool_call>')[1] == [("f", '{"a": 1}')]
    assert whole(HERMES, '<tool_call>{"name":"f"}</tool_call>')[1] == [("f", "{}")]
    assert whole(HERMES, '<tool_call>{"name":"f","arguments":null}</tool_call>')[1] == [("f", "{}")]


def test_a_section_may_hold_an_array_of_calls():
    text = '<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"b": 2}}]</tool_call>'
    assert whole(HERMES, text) == ("", [("f", "{}"), ("g", '{"b": 2}')])


@pytest.mark.parametrize(
    "text",
    [
        "Hello <tool_call> not json </tool_call> bye",
        'Use <tool_call>{"city": "Paris"}</tool_call> like so',  # JSON, but no name: not a call
        "An unfinished marker at the end <tool_c",
        "<tool_call>",
    ],
)
def test_text_that_holds_no_call_is_content_as_written(text):
    assert whole(HERMES, text) == (text, [])


def test_a_call_cut_off_by_the_token_limit_keeps_what_came():
    assert whole(HERMES, 'x <tool_call>{"name": "f", "arguments": {"a": 1') == ("x", [("f", '{"a": 1')])


def test_junk_after_a_call_is_dropped_up_to_the_closing_marker():
    assert whole(HERMES, '<tool_call>{"name": "f", "arguments": {}}}</tool_call> done') == ("done", [("f", "{}")])


def test_llama_calls_are_json_at_the_start():
    text = ' {"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}'
    assert whole(LLAMA, text) == ("", [("f", '{"a": 1}'), ("g", "{}")])
    assert whole(LLAMA, '<|python_tag|>{"name": "f", "parameters": {}}') == ("", [("f", "{}")])
    for text in ('{"answer": 42} is the reply', 'The call would be {"name": "f"}'):
        assert whole(LLAMA, text) == (text, [])


def test_mistral_calls_with_or_without_their_special_token():
    calls = [("f", '{"a": 1}'), ("g", '{"b": 2}')]
    array = '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": 2}}]'
    assert whole(MISTRAL, array) == ("", calls)
    assert whole(MISTRAL, "I will look. [TOOL_CALLS]" + array) == ("I will look.", calls)
    assert whole(MISTRAL, "[a link](https://x) here") == ("[a link](https://x) here", [])


def test_without_parallel_calls_only_the_first_counts():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>'
    assert whole(HERMES, text, parallel=False) == ("", [("f", "{}")])


def test_a_demanded_call_may_be_bare_json_in_any_family():
    text = '{"name": "f", "arguments": {"x": 1}}'
    assert whole(HERMES, text) == (text, [])
    assert whole(HERMES, text, forced=True) == ("", [("f", '{"x": 1}')])


# --- streamed replies: every cut gives the whole's result --------------------------------------

names = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
markers = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>"]
prose = st.lists(st.sampled_from(list('ab <>/{}[]"\\:,;\n_') + markers), max_size=30).map("".join)


def hermes_text(before: str, calls: list[tuple[str, dict]]) -> str:
    blocks = [
        f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"
        for name, args in calls
    ]
    return before + "\n".join(blocks)


@settings(max_examples=300, deadline=None)
@given(
    before=st.text(alphabet=st.characters(blacklist_characters="<"), max_size=20),
    calls=st.lists(st.tuples(names, arguments), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_hermes_calls_survive_any_cut(before, calls, cuts):
    text = hermes_text(before, calls)
    content, parsed = streamed(HERMES, text, [c for c in cuts if c <= len(text)])
    assert content == before.rstrip(" \t\r\n")
    assert [(name, json.loads(args)) for name, args in parsed] == calls
    assert (content, parsed) == whole(HERMES, text)


@settings(max_examples=500, deadline=None)
@given(
    fmt=st.sampled_from(list(FORMATS.values())),
    text=st.lists(prose | st.builds(json.dumps, st.fixed_dictionaries({"name": names, "arguments": arguments}))).map(
        "".join
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
    forced=st.booleans(),
)
@example(  # text after a section's calls is skipped up to its closer, though a cut falls inside it
    fmt=FORMATS["hermes"],
    text='a<tool_call>{"name": "_0", "arguments": {}}aaa {"name": "_", "arguments": {}}',
    cuts=[47],
    forced=False,
)
def test_any_text_gives_the_same_split_whole_and_streamed(fmt, text, cuts, forced):
    cuts = [c for c in cuts if c <= len(text)]
    assert streamed(fmt, text, cuts, forced=forced) == whole(fmt, text, forced=forced)


@given(text=st.text(max_size=40), cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8))
def test_text_without_markers_streams_as_it_is(text, cuts):
    text = text.replace("<", "(")
    content, calls = streamed(HERMES, text, [c for c in cuts if c <= len(text)])
    assert (content, calls) == (text, [])


def test_a_partial_marker_waits_instead_of_leaking():
    parser = ToolCallParser(HERMES.syntax)
    assert parser.push("Sure. <tool").content == "Sure."
    assert parser.push("_call>").content == ""
    delta = parser.push('{"name": "f", "arguments": {"a"')
    assert [(d.index, d.name, d.arguments) for d in delta.calls] == [(0, "f", ""), (0, None, '{"a"')]
    assert parser.push(": 1}}\n</tool_call>").calls[0].arguments == ": 1}"


# --- which family ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ("{{ '<tool_call>' }}{{ tools }}", "hermes"),
        ("{%- if tools %}{{- '[AVAILABLE_TOOLS]' }}{%- endif %}{{ '[TOOL_CALLS]' }}", "mistral"),
        ("{{- '<|python_tag|>' }}{%- if message.role == 'ipython' %}", "llama3_json"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "hermes"),  # no tools: the fallback's format
    ],
)
def test_the_family_is_read_from_the_template(template, family):
    assert detect(template).name == family
    assert tool_format("auto", template).name == family
    assert tool_format("llama3", template).name == "llama3_json"


def test_the_template_is_read_from_the_model_directory(tmp_path):
    assert chat_template_text(tmp_path) == ""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "x", "template": "T"}]}))
    assert chat_template_text(tmp_path) == "T"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert chat_template_text(tmp_path) == "J"
