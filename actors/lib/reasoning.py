"""A reply's thinking, `<think>...</think>` as Qwen3 and DeepSeek-R1 write it, split from its
answer as the text streams in (`--reasoning-parser`).

Where a reply starts: in its thinking when the prompt left a `<think>` open (a template that opens
it for the model, such as DeepSeek-R1's or Qwen3's thinking models'), or, with `deepseek-r1`, always
unless the prompt closed it, as vLLM reads R1, whose replies may start thinking without the tag;
otherwise in the answer, until a reply that starts with `<think>` opens it. `</think>` ends the
thinking, and the whitespace after it is dropped. A reply that never closes its thinking is all
thinking. As with tool calls, a marker's possible start is held back, so any cut of the text gives
the same split as the whole.
"""

from dataclasses import dataclass

from actors.lib.markers import partial_suffix

THINK_START, THINK_END = "<think>", "</think>"
PARSER_NAMES = ("none", "deepseek-r1", "deepseek_r1", "qwen3")
_WHITESPACE = " \t\r\n"


@dataclass(slots=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


def starts_in_reasoning(parser: str, prompt_ids: list[int], think_ids: tuple[int, int] | None) -> bool:
    """Whether a reply to this prompt starts inside its thinking. `think_ids`: the token ids of
    `<think>` and `</think>` when the vocabulary has them; the last of them in the prompt says
    whether the template left the thinking open."""
    last = None
    if think_ids is not None:
        last = next((t for t in reversed(prompt_ids) if t in think_ids), None)
    if last is not None:
        return last == think_ids[0]
    return parser in ("deepseek-r1", "deepseek_r1")


class ReasoningParser:
    def __init__(self, in_reasoning: bool) -> None:
        self._state = "start"  # start -> thinking -> after (whitespace) -> answer
        self._starts_thinking = in_reasoning
        self._text = ""

    def push(self, text: str) -> ReasoningDelta:
        self._text += text
        return self._run(final=False)

    def finish(self) -> ReasoningDelta:
        return self._run(final=True)

    def _run(self, final: bool) -> ReasoningDelta:
        out = ReasoningDelta()
        while self._text and self._step(out, final):
            pass
        return out

    def _step(self, out: ReasoningDelta, final: bool) -> bool:
        text = self._text
        if self._state == "start":
            rest = text.lstrip(_WHITESPACE)
            if THINK_START.startswith(rest) and rest != THINK_START and not final:
                return False
            if rest.startswith(THINK_START):
                self._text = rest[len(THINK_START) :]
                self._state = "thinking"
            else:
                self._state = "thinking" if self._starts_thinking else "answer"
            return True
        if self._state == "thinking":
            at = text.find(THINK_END)
            if at >= 0:
                out.reasoning += text[:at]
                self._text = text[at + len(THINK_END) :]
                self._state = "after"
                return True
            cut = len(text) if final else len(text) - partial_suffix(text, THINK_END)
            out.reasoning += text[:cut]
            self._text = text[cut:]
            return False
        if self._state == "after":
            rest = text.lstrip(_WHITESPACE)
            self._text = rest
            if not rest:
                return False
            self._state = "answer"
            return True
        out.content += text
        self._text = ""
        return False
