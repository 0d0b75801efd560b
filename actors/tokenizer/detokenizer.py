"""Incremental detokenization of one request's output, with stop strings and stop regexes.

Text is released as soon as it is valid UTF-8, except the last few characters that could still
become the start of a stop string: those wait until the next token or the end, so a client never
sees text that a stop string later takes back. A regex can match text of any length, so nothing is
held back for it: it is searched in the whole text after every token, and a match that begins in
text already released cuts only what was not.

The tokens a client gets are those consumed up to and including the one whose text completed a
match; their logprobs are cut the same way (by the tokenizer actor, from `TextUpdate.token_ids`).
"""

import re
from dataclasses import dataclass

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


@dataclass(frozen=True)
class TextUpdate:
    token_ids: list[int]  # the tokens consumed (none past a matched stop string)
    text: str  # text released by this update
    stopped: bool  # a stop string matched; the request must end


class StreamingDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        stop: list[str],
        skip_special_tokens: bool = True,
        delivered_ids: list[int] = (),
        delivered_chars: int = 0,
        stop_regex: list[str] = (),
        include_stop: bool = False,
    ) -> None:
        """`delivered_ids` and `delivered_chars`: what the client already has, when tracking
        resumes after a crash; decoding continues after them and nothing is released twice.
        `stop_regex`: patterns of Python's `re` (the origin checked they compile). `include_stop`:
        the matched stop string or regex match stays in the text."""
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._stop = [s for s in stop if s]
        self._regexes = [re.compile(pattern) for pattern in stop_regex]
        self._include_stop = include_stop
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""  # everything decoded so far (cut at a stop string once one matched)
        self._released = 0
        self.completion_tokens = 0
        self.stopped = False
        self.matched_stop: str | None = None  # the stop string, or the regex's pattern, that matched
        if delivered_ids:
            self.push(list(delivered_ids))
            self._released = delivered_chars

    def push(self, token_ids: list[int], final: bool = False, first_index: int | None = None) -> TextUpdate:
        """Feeds new tokens; `final` releases the held-back tail (the request ends here).

        `first_index` is the output position of `token_ids[0]`: tokens this detokenizer already
        consumed are skipped, so a repeat after a restart upstream is harmless.
        """
        if first_index is not None:
            token_ids = token_ids[max(0, self.completion_tokens - first_index) :]
        consumed = []
        for token_id in token_ids:
            if self.stopped:
                break
            consumed.append(token_id)
            self.completion_tokens += 1
            piece = self._stream.step(self._tokenizer, token_id)
            if piece:
                self._append(piece)
        end = len(self.text) if (final or self.stopped) else max(self._released, len(self.text) - self._holdback)
        released = self.text[self._released : end]
        self._released = max(self._released, end)
        return TextUpdate(consumed, released, self.stopped)

    def _append(self, piece: str) -> None:
        search_from = max(0, len(self.text) - self._holdback)
        self.text += piece
        matches = [(i, i + len(s), s) for s in self._stop if (i := self.text.find(s, search_from)) >= 0]
        matches += [(m.start(), m.end(), r.pattern) for r in self._regexes if (m := r.search(self.text))]
        if matches:
            start, end, matched = min(matches)
            self.text = self.text[: end if self._include_stop else start]
            self.stopped, self.matched_stop = True, matched
