"""Logprobs as they travel (`TokenLogprobs`: consecutive positions from `start`), cut and joined
on their way from the executor to a client: the tokenizer keeps those of the tokens a client
gets, and the origin joins a request's into one run, each position once."""

from schemas.generate import TokenLogprobs


def slice_logprobs(logprobs: TokenLogprobs | None, begin: int, end: int) -> TokenLogprobs | None:
    """Entries `begin` to `end` (offsets into `logprobs`), which then start at position
    `logprobs.start + begin`; None when that leaves none."""
    if logprobs is None or begin >= min(end, len(logprobs.logprobs)):
        return None
    return TokenLogprobs(
        logprobs.start + begin,
        logprobs.logprobs[begin:end],
        logprobs.top_ids[begin:end],
        logprobs.top_logprobs[begin:end],
        logprobs.id_logprobs[begin:end],
    )


def token_ids_of(logprobs: TokenLogprobs | None) -> set[int]:
    """The alternatives' token ids it names (the tokens at its positions are the caller's to know)."""
    return {t for top in logprobs.top_ids for t in top} if logprobs else set()


class LogprobsRun:
    """The logprobs of consecutive positions, joined as they arrive. Invariant: each position is
    held once; what arrives after a gap is not taken (nothing can fill the gap any more)."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.logprobs: list[float] = []
        self.top_ids: list[list[int]] = []
        self.top_logprobs: list[list[float]] = []
        self.id_logprobs: list[list[float]] = []

    @property
    def end(self) -> int | None:
        """The position after the last held; None while none is."""
        return None if self.start is None else self.start + len(self.logprobs)

    def extend(self, logprobs: TokenLogprobs | None) -> TokenLogprobs | None:
        """Takes the positions of `logprobs` past those held; returns them (None if none are new)."""
        if logprobs is None:
            return None
        if self.start is None:
            self.start = logprobs.start
        if logprobs.start > self.end:
            return None
        new = slice_logprobs(logprobs, self.end - logprobs.start, len(logprobs.logprobs))
        if new is not None:
            self.logprobs += new.logprobs
            self.top_ids += new.top_ids
            self.top_logprobs += new.top_logprobs
            self.id_logprobs += new.id_logprobs
        return new

    def whole(self) -> TokenLogprobs | None:
        """Every position held, as one; None while none is."""
        if self.start is None:
            return None
        return TokenLogprobs(
            self.start, list(self.logprobs), list(self.top_ids), list(self.top_logprobs), list(self.id_logprobs)
        )
