"""Tools for a chat template that renders none, such as the default model's (SmolLM2's): the
conversation is rewritten as Qwen2.5's template would write it, in Hermes' format, which the
default tool-call parser reads (actors/lib/tool_calls/hermes.py).

The tools are described in the system message (one is added at the start when there is none), an
assistant's calls become `<tool_call>` blocks in its text, and each run of tool results becomes one
user turn of `<tool_response>` blocks. vLLM and SGLang leave such a template as it is, so the model
never sees the tools; here a client gets what it asked for from any template, at the cost of the
template's own default system prompt where it had one.
"""

import json
import re

_MENTIONS_TOOLS = re.compile(r"\btools\b")

TOOLS_PREAMBLE = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def renders_tools(template: str | dict | None) -> bool:
    """Whether the template (or, with named templates, one of them) reads the `tools` variable."""
    texts = template.values() if isinstance(template, dict) else [template or ""]
    return any(_MENTIONS_TOOLS.search(text) for text in texts)


def needs_rewrite(conversation: list[dict], tools: list[dict]) -> bool:
    return bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in conversation)


def hermes_conversation(conversation: list[dict], tools: list[dict]) -> list[dict]:
    """`conversation` (OpenAI-shaped dicts) with `tools`, in roles any template renders."""
    rewritten: list[dict] = []
    for message in conversation:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            calls = [_call_block(call["function"]) for call in message["tool_calls"]]
            text = "\n".join(([message["content"]] if message["content"] else []) + calls)
            rewritten.append({"role": "assistant", "content": text})
        elif role == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if rewritten and rewritten[-1].get("tool_results"):
                rewritten[-1]["content"] += "\n" + block
            else:
                rewritten.append({"role": "user", "content": block, "tool_results": True})
        else:
            rewritten.append({"role": role, "content": message["content"]})
    for message in rewritten:
        message.pop("tool_results", None)
    if tools:
        described = TOOLS_PREAMBLE.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))
        if rewritten and rewritten[0]["role"] == "system":
            rewritten[0]["content"] = f"{rewritten[0]['content']}\n\n{described}"
        else:
            rewritten.insert(0, {"role": "system", "content": described})
    return rewritten


def _call_block(function: dict) -> str:
    call = {"name": function["name"], "arguments": function["arguments"]}
    return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
