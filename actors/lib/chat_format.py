"""What the served model writes in a chat reply beside its answer, known once at start: the format
of its tool calls (`--tool-call-parser`, or read from its chat template), the reasoning parser
(`--reasoning-parser`), and the ids of its `<think>` and `</think>` tokens, which tell from a
prompt whether the template left the thinking open.

Both doors that answer chat requests, the frontdoor (HTTP) and the gateway (the bus), read it here
from the same config (`ChatFormat.of_config`), so they read replies alike. It comes from the model
directory the door was given; a door that cannot read it (the model on another machine) assumes
Hermes' format and no think tokens.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from actors.lib.reasoning import THINK_END, THINK_START
from actors.lib.tool_calls import hermes
from actors.lib.tool_calls.families import chat_template_text, tool_format
from actors.lib.tool_calls.tool_format import ToolFormat
from kernel.config import KernelConfig


@dataclass(frozen=True)
class ChatFormat:
    tool_format: ToolFormat = hermes.FORMAT
    reasoning_parser: str = "none"  # one of actors.lib.reasoning.PARSER_NAMES
    think_ids: tuple[int, int] | None = None

    @classmethod
    def of_config(cls, config: KernelConfig) -> "ChatFormat":
        return cls.of_model(config.engine.model, config.chat.tool_call_parser, config.chat.reasoning_parser)

    @classmethod
    def of_model(cls, model_dir: str | None, tool_call_parser: str, reasoning_parser: str) -> "ChatFormat":
        fmt = tool_format(tool_call_parser, chat_template_text(model_dir))
        think_ids = think_token_ids(model_dir) if reasoning_parser != "none" else None
        return cls(fmt, reasoning_parser, think_ids)


def think_token_ids(model_dir: str | Path | None) -> tuple[int, int] | None:
    """The ids of `<think>` and `</think>` as single tokens of the model's tokenizer.json (added
    tokens, or the vocabulary's own), or None when it has not both."""
    if model_dir is None:
        return None
    try:
        tokenizer = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None
    ids = {t.get("content"): t.get("id") for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict)}
    vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids = {k: vocab[k] for k in (THINK_START, THINK_END) if k in vocab} | ids
    start, end = ids.get(THINK_START), ids.get(THINK_END)
    return (start, end) if isinstance(start, int) and isinstance(end, int) else None
