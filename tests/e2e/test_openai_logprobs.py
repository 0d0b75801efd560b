"""Logprobs read by the official `openai` SDK with no adapter: chat and completions, whole and
streamed, and completions' echo of the prompt. The SDK's own types must parse every field."""

import math

import pytest

TOLERANCE = 1e-5  # the same request computed twice on the CPU
CHAT = dict(model="demo", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=10, temperature=0)
COMPLETION = dict(model="demo", prompt="The river", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})


def test_chat_logprobs_whole(client):
    reply = client.chat.completions.create(**CHAT, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert math.isfinite(entry.logprob) and entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode())
        tops = [top.logprob for top in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert entry.logprob == pytest.approx(tops[0], abs=TOLERANCE)  # greedy draws the most likely


def test_chat_logprobs_streamed_are_the_whole_replys(client):
    whole = client.chat.completions.create(**CHAT, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(**CHAT, logprobs=True, top_logprobs=2, stream=True))
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in whole]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in whole], abs=TOLERANCE)
    assert [[t.token for t in e.top_logprobs] for e in streamed] == [[t.token for t in e.top_logprobs] for e in whole]


def test_chat_without_logprobs_has_none(client):
    assert client.chat.completions.create(**CHAT).choices[0].logprobs is None


def test_completion_logprobs_whole(client):
    reply = client.completions.create(**COMPLETION, logprobs=3)
    logprobs = reply.choices[0].logprobs
    count = reply.usage.completion_tokens
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == count
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset == sorted(logprobs.text_offset) and len(logprobs.text_offset) == count
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert logprob <= 0 and 1 <= len(top) <= 3  # a dict: tokens of the same text share a key
        assert max(top.values()) == pytest.approx(logprob, abs=TOLERANCE) and token in top


def test_completion_logprobs_streamed_are_the_whole_replys(client):
    whole = client.completions.create(**COMPLETION, logprobs=2).choices[0].logprobs
    chunks = list(client.completions.create(**COMPLETION, logprobs=2, stream=True))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    values = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert tokens == whole.tokens
    assert values == pytest.approx(whole.token_logprobs, abs=TOLERANCE)


def test_completion_echo_scores_the_prompt(client):
    """A text scored through completions, as evaluation harnesses do on servers that want
    max_tokens >= 1: echo it with logprobs, generate one token, read the prompt's part."""
    prompt = "The river runs"
    reply = client.completions.create(model="demo", prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0)
    logprobs, usage = reply.choices[0].logprobs, reply.usage
    assert reply.choices[0].text.startswith(prompt)
    assert len(logprobs.tokens) == usage.prompt_tokens + usage.completion_tokens
    # The prompt as the model reads it, a BOS token first: every token named by its text, as vLLM
    # names them (tokenizer.decode of the id), not `token_id:<id>`, which was not asked for.
    assert "".join(logprobs.tokens[: usage.prompt_tokens]).endswith(prompt)
    assert not [token for token in logprobs.tokens if token.startswith("token_id:")]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(v <= 0 for v in logprobs.token_logprobs[1:]) and all(top for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset[: usage.prompt_tokens + 1] == sorted(logprobs.text_offset[: usage.prompt_tokens + 1])
