"""The reasoning parser: where a reply's thinking ends, whole and cut anywhere, and where it starts
given the prompt."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.lib.reasoning import ReasoningParser, starts_in_reasoning

THINK_IDS = (7, 8)  # <think>, </think>


def split(text: str, in_reasoning: bool, cuts: list[int] = ()) -> tuple[str, str]:
    parser = ReasoningParser(in_reasoning)
    reasoning = content = ""
    bounds = [0, *sorted(set(cuts)), len(text)]
    for start, end in zip(bounds, bounds[1:]):
        delta = parser.push(text[start:end])
        reasoning, content = reasoning + delta.reasoning, content + delta.content
    delta = parser.finish()
    return reasoning + delta.reasoning, content + delta.content


@pytest.mark.parametrize(
    ("text", "in_reasoning", "expected"),
    [
        ("<think>\nLet me see.\n</think>\n\nParis.", False, ("\nLet me see.\n", "Paris.")),
        ("<think>\nLet me see.\n</think>\n\nParis.", True, ("\nLet me see.\n", "Paris.")),
        ("Let me see.</think>Paris.", True, ("Let me see.", "Paris.")),  # the prompt opened it
        ("Paris.", False, ("", "Paris.")),
        ("Still thinking when the limit came", True, ("Still thinking when the limit came", "")),
        ("<think>cut off", False, ("cut off", "")),
        ("  <thin", False, ("", "  <thin")),
        ("An answer that mentions </think> late", False, ("", "An answer that mentions </think> late")),
    ],
)
def test_thinking_and_answer_whole(text, in_reasoning, expected):
    assert split(text, in_reasoning) == expected


@given(
    thinking=st.text(max_size=30).map(lambda t: t.replace("<", "(")),
    answer=st.text(max_size=30),
    opened=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=10),
)
def test_any_cut_gives_the_whole_s_split(thinking, answer, opened, cuts):
    text = ("" if opened else "<think>") + thinking + "</think>\n\n" + answer
    cuts = [c for c in cuts if c <= len(text)]
    assert split(text, opened, cuts) == split(text, opened)
    assert split(text, opened) == (thinking, answer.lstrip(" \t\r\n"))


def test_the_prompt_says_where_a_reply_starts():
    qwen_thinking = [1, 2, 7, 3]  # the template opened <think>
    qwen_no_thinking = [1, 2, 7, 3, 8, 3]  # enable_thinking false: an empty, closed block
    for parser in ("qwen3", "deepseek-r1"):
        assert starts_in_reasoning(parser, qwen_thinking, THINK_IDS)
        assert not starts_in_reasoning(parser, qwen_no_thinking, THINK_IDS)
    # No marker in the prompt: R1 may start thinking without the tag, Qwen3 writes it.
    assert starts_in_reasoning("deepseek-r1", [1, 2], THINK_IDS)
    assert not starts_in_reasoning("qwen3", [1, 2], THINK_IDS)
    assert starts_in_reasoning("deepseek-r1", [1, 2], None)
