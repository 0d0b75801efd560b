"""Which tool-call format a model writes: named by `--tool-call-parser` (vLLM's and SGLang's names
are both taken), or read from its chat template with `auto`.

A template that speaks of `[TOOL_CALLS]` is Mistral's, one with `<|python_tag|>` or the `ipython`
role is Llama 3's, and any other is taken for Hermes': the templates of Qwen2.5, Qwen3 and Hermes
write `<tool_call>`, and a template that renders no tools gets the tools described in Hermes'
format by the tokenizer (actors/tokenizer/tool_prompt.py).
"""

import json
from pathlib import Path

from actors.lib.tool_calls import hermes, llama3_json, mistral
from actors.lib.tool_calls.tool_format import ToolFormat

FORMATS = {f.name: f for f in (hermes.FORMAT, llama3_json.FORMAT, mistral.FORMAT)}
ALIASES = {"qwen25": "hermes", "qwen": "hermes", "qwen3": "hermes", "llama3": "llama3_json"}
PARSER_NAMES = ("auto", *FORMATS, *ALIASES)  # the choices of --tool-call-parser


def detect(template: str) -> ToolFormat:
    if "[TOOL_CALLS]" in template:
        return mistral.FORMAT
    if "<|python_tag|>" in template or "ipython" in template:
        return llama3_json.FORMAT
    return hermes.FORMAT


def tool_format(parser: str, template: str) -> ToolFormat:
    """`parser`: one of PARSER_NAMES; `template`: the chat template's text, for `auto`."""
    if parser == "auto":
        return detect(template)
    return FORMATS[ALIASES.get(parser, parser)]


def chat_template_text(model_dir: str | Path | None) -> str:
    """The text of the model directory's chat templates (all of them, if it names several), as
    transformers finds them: `chat_template.jinja` or `tokenizer_config.json`. Empty when there
    is none or the directory cannot be read here."""
    if model_dir is None:
        return ""
    model_dir = Path(model_dir)
    try:
        return (model_dir / "chat_template.jinja").read_text()
    except OSError:
        pass
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return ""
    template = config.get("chat_template") or ""
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        return "\n".join(t.get("template", "") for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else ""
