"""Logprobs in OpenAI's shapes, and vLLM's `prompt_logprobs`, as dicts ready to encode.

Chat: `choices[i].logprobs.content`, an entry per token with its top alternatives. Completions:
`choices[i].logprobs` as parallel lists (tokens, token_logprobs, top_logprobs, text_offset), where
`echo` puts the prompt's first, whose first token has no logprob. A token is named by its text as
the tokenizer decoded it alone; without one (no text was asked for, or `return_tokens_as_token_ids`)
it is `token_id:<id>`, as vLLM names it. No I/O.
"""

import math
from collections.abc import Iterator

from actors.frontdoor.choice_output import LogprobRun
from schemas.generate import TokenLogprobs

# JSON has no -inf, the logprob of a token the filters removed (processed logprobs); vLLM reports
# such a token with this value, so clients that parse floats keep working.
LOWEST_LOGPROB = -9999.0
Logprobs = TokenLogprobs | LogprobRun


def token_name(token_id: int, texts: dict[int, str], as_ids: bool = False) -> str:
    text = None if as_ids else texts.get(token_id)
    return f"token_id:{token_id}" if text is None else text


def finite(logprob: float) -> float:
    return LOWEST_LOGPROB if math.isnan(logprob) or logprob < LOWEST_LOGPROB else logprob


def _positions(token_ids: list[int], logprobs: Logprobs | None, offset: int = 0) -> Iterator[tuple]:
    """(token id, its logprob, [(id, logprob)] of the most likely) for each of `token_ids`, whose
    logprobs are `logprobs`' entries from `offset` on; positions it lacks give no entry."""
    if logprobs is None:
        return
    for i, token_id in enumerate(token_ids):
        j = offset + i
        if not 0 <= j < len(logprobs.logprobs):
            continue
        tops = list(zip(logprobs.top_ids[j], logprobs.top_logprobs[j])) if j < len(logprobs.top_ids) else []
        yield token_id, logprobs.logprobs[j], tops


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def chat_logprobs(
    token_ids: list[int], logprobs: Logprobs | None, texts: dict[int, str], top_n: int, as_ids: bool = False
) -> dict:
    """`choices[i].logprobs` of a chat completion (or of one stream chunk, for its tokens)."""
    content = []
    for token_id, logprob, tops in _positions(token_ids, logprobs):
        name = token_name(token_id, texts, as_ids)
        alternatives = []
        for top_id, top_logprob in tops[:top_n]:
            top_name = token_name(top_id, texts, as_ids)
            alternatives.append({"token": top_name, "logprob": finite(top_logprob), "bytes": _utf8(top_name)})
        content.append({"token": name, "logprob": finite(logprob), "bytes": _utf8(name), "top_logprobs": alternatives})
    return {"content": content, "refusal": None}


class CompletionLogprobs:
    """`choices[i].logprobs` of a completion, built in pieces (the echoed prompt, then the output,
    or one stream chunk after another); `text_offset` runs on across pieces, as vLLM counts it."""

    def __init__(self, top_n: int, texts: dict[int, str], as_ids: bool = False, text_offset: int = 0) -> None:
        self.top_n = top_n
        self.texts = texts
        self.as_ids = as_ids
        self.text_offset = text_offset
        self.body: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add_prompt(self, prompt_ids: list[int], logprobs: Logprobs | None) -> None:
        """The echoed prompt: its first token has no logprob; so has any position not computed."""
        start = logprobs.start if logprobs is not None and logprobs.start is not None else len(prompt_ids)
        by_position = {start + i: entry for i, entry in enumerate(_positions(prompt_ids[start:], logprobs))}
        for position, token_id in enumerate(prompt_ids):
            entry = by_position.get(position)
            self._add(token_id, None if entry is None else entry[1], None if entry is None else entry[2])

    def add_output(self, token_ids: list[int], logprobs: Logprobs | None, offset: int = 0) -> None:
        for token_id, logprob, tops in _positions(token_ids, logprobs, offset):
            self._add(token_id, logprob, tops)

    def _add(self, token_id: int, logprob: float | None, tops: list | None) -> None:
        name = token_name(token_id, self.texts, self.as_ids)
        body = self.body
        body["tokens"].append(name)
        body["text_offset"].append(self.text_offset)
        self.text_offset += len(self.texts.get(token_id, ""))
        if logprob is None:
            body["token_logprobs"].append(None)
            body["top_logprobs"].append(None)
            return
        body["token_logprobs"].append(finite(logprob))
        # The chosen token and the top_n most likely, as vLLM gives them (top_n may be 0).
        alternatives = {name: finite(logprob)}
        for top_id, top_logprob in tops[: self.top_n]:
            alternatives.setdefault(token_name(top_id, self.texts, self.as_ids), finite(top_logprob))
        body["top_logprobs"].append(alternatives)

    def take(self) -> dict:
        """The body so far, and a fresh one for the next piece (the offset goes on)."""
        body, self.body = self.body, {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        return body


def prompt_logprobs(prompt_ids: list[int], logprobs: LogprobRun, texts: dict[int, str], top_n: int) -> list:
    """vLLM's `prompt_logprobs`: per prompt position, None where nothing was computed (the first
    token always), else {token id: {logprob, rank, decoded_token}} for the prompt's token and the
    top_n most likely. A rank is known for a token among the most likely; else it is null."""
    start = logprobs.start if logprobs.start is not None else len(prompt_ids)
    out: list = [None] * min(start, len(prompt_ids))
    for token_id, logprob, tops in _positions(prompt_ids[start:], logprobs):
        ranks = {top_id: rank for rank, (top_id, _) in enumerate(tops, start=1)}
        entry = {str(token_id): _vllm_logprob(logprob, ranks.get(token_id), texts.get(token_id))}
        for rank, (top_id, top_logprob) in enumerate(tops[:top_n], start=1):
            entry.setdefault(str(top_id), _vllm_logprob(top_logprob, rank, texts.get(top_id)))
        out.append(entry)
    return out + [None] * (len(prompt_ids) - len(out))


def _vllm_logprob(logprob: float, rank: int | None, text: str | None) -> dict:
    return {"logprob": finite(logprob), "rank": rank, "decoded_token": text}
