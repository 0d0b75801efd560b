"""A template that renders no tools gets the conversation in Hermes' format: the tools in the system
message, calls as `<tool_call>` blocks, each run of tool results as one user turn."""

from actors.tokenizer.tool_prompt import hermes_conversation, needs_rewrite, renders_tools

TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
CALLS = [
    {"id": "a", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "UTC"}}},
    {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "CET"}}},
]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Time in UTC and CET?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": CALLS},
    {"role": "tool", "content": "12:00", "tool_call_id": "a"},
    {"role": "tool", "content": "13:00", "tool_call_id": "b"},
    {"role": "assistant", "content": "12:00 and 13:00."},
]


def test_which_templates_render_tools():
    assert renders_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not renders_tools("{% for m in messages %}{{ m.tool_calls }}{% endfor %}")
    assert renders_tools({"default": "plain", "tool_use": "{{ tools }}"})
    assert not renders_tools(None)


def test_the_conversation_in_hermes_format():
    rewritten = hermes_conversation(CONVERSATION, [TOOL])
    assert [m["role"] for m in rewritten] == ["system", "user", "assistant", "user", "assistant"]
    system = rewritten[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools\n")
    assert (
        '<tools>\n{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}\n</tools>'
        in system
    )
    assert rewritten[2]["content"] == (
        'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    )
    assert rewritten[3] == {
        "role": "user",
        "content": "<tool_response>\n12:00\n</tool_response>\n<tool_response>\n13:00\n</tool_response>",
    }
    assert CONVERSATION[0]["content"] == "Be brief."  # the request's own messages are left alone


def test_without_tools_only_the_calls_are_rewritten():
    assert not needs_rewrite(CONVERSATION[:2], [])
    assert needs_rewrite(CONVERSATION, [])
    rewritten = hermes_conversation(CONVERSATION[1:], [])
    assert rewritten[0] == {"role": "user", "content": "Time in UTC and CET?"}
