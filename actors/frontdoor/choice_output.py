"""What one choice of a request has delivered so far, gathered from its outputs for the doors that
answer with the whole of it: a body at the end, or SGLang's cumulative stream events.

No I/O. The origin hands outputs over in order, each continuing the last (request_stream.py), so
the parts here only append; a logprob part that does not continue its run is a repeat and is
dropped, so a run never holds a position twice. The weights behind the tokens are the origin's
record's, which books them as outputs arrive; a choice reads them cut to the tokens it holds.
"""

from dataclasses import dataclass, field

from actors.lib.origin.request_stream import RequestRecord
from schemas.generate import TokenLogprobs
from schemas.requests import RequestOutput


@dataclass
class LogprobRun:
    """Logprobs at consecutive positions from `start` (of the outputs, or of the prompt): the parts
    of a request's `TokenLogprobs`, joined. The same fields as `TokenLogprobs`, so a renderer
    takes either."""

    start: int | None = None
    logprobs: list[float] = field(default_factory=list)  # [N]
    top_ids: list[list[int]] = field(default_factory=list)  # [N][top_logprobs], most likely first
    top_logprobs: list[list[float]] = field(default_factory=list)  # [N][top_logprobs]
    id_logprobs: list[list[float]] = field(default_factory=list)  # [N][len(logprob_token_ids)]

    @property
    def end(self) -> int | None:
        """The position after the last one held."""
        return None if self.start is None else self.start + len(self.logprobs)

    def extend(self, part: TokenLogprobs | None) -> None:
        if part is None or not part.logprobs:
            return
        if self.start is None:
            self.start = part.start
        elif part.start != self.end:
            return
        self.logprobs += part.logprobs
        self.top_ids += part.top_ids
        self.top_logprobs += part.top_logprobs
        self.id_logprobs += part.id_logprobs


@dataclass
class ChoiceOutput:
    record: RequestRecord  # the origin's, which books the weight versions of the tokens
    token_ids: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    completion_tokens: int = 0
    logprobs: LogprobRun = field(default_factory=LogprobRun)  # of token_ids, from output 0
    prompt_logprobs: LogprobRun = field(default_factory=LogprobRun)
    token_texts: dict[int, str] = field(default_factory=dict)  # the text of each token id in the logprobs

    @property
    def text(self) -> str:
        if len(self.text_parts) > 1:
            self.text_parts = ["".join(self.text_parts)]
        return self.text_parts[0] if self.text_parts else ""

    @property
    def version_spans(self) -> list[tuple[int, str]]:
        """[(first token index, version)], at least one: token_ids from each index on, up to the
        next span's, were computed by that version's weights (the record's spans, cut to the
        tokens read here: the record may be ahead)."""
        return self.record.version_spans_of(len(self.token_ids))

    @property
    def weight_version(self) -> str:
        """Of the weights that computed the last token (with none, those serving the request)."""
        return self.version_spans[-1][1]

    def add(self, output: RequestOutput) -> None:
        self.token_ids += output.token_ids
        self.text_parts.append(output.text)
        self.logprobs.extend(output.logprobs)
        self.prompt_logprobs.extend(output.prompt_logprobs)
        self.token_texts.update(output.token_texts)
        self.completion_tokens = max(self.completion_tokens, output.completion_tokens)
        if output.finish_reason:
            self.finish_reason = output.finish_reason
            self.matched_stop = output.matched_stop
