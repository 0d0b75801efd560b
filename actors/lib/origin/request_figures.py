"""What an origin counts of the requests it takes, for `/metrics`: the latencies it sees (the
first token, each later delivery, the end) and the tokens, since the process started. The
origin is where these times are known: it receives every output of its requests, and its clock
starts when the client's request arrives.

Plain counting with no I/O and no lock: a delivery costs a clock read and a bisect. The frontdoor
gathers every origin's figures over the bus (`schemas/metrics.py`) and adds them up.
"""

import bisect
import time

from schemas.metrics import Histogram, RequestFigures

# vLLM's bounds (vllm/v1/metrics/loggers.py), so its dashboards read the same resolution; inter-token
# latency also gets bounds under 10 ms, where a decode step of this server lands.
TTFT_BOUNDS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BOUNDS_S += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BOUNDS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
TOKEN_LATENCY_BOUNDS_S += (0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BOUNDS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
REQUEST_LATENCY_BOUNDS_S += (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_COUNT_BOUNDS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5) if m * 10**e <= 1_000_000)

# Every end has one of these, and each is shown from the first scrape on, at 0 until it happens.
FINISH_REASONS = ("stop", "length", "abort", "error")


class Counts:
    """One histogram's buckets, not cumulative: `counts[i]` holds what is <= `bounds[i]` and above
    the bound before it; the last, what is above every bound."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def wire(self) -> Histogram:
        return Histogram(list(self.bounds), list(self.counts), self.sum)


class OriginFigures:
    """The figures of every request one origin took."""

    def __init__(self, origin_id: str) -> None:
        self.origin_id = origin_id
        self.time_to_first_token = Counts(TTFT_BOUNDS_S)
        self.inter_token_latency = Counts(TOKEN_LATENCY_BOUNDS_S)
        self.time_per_output_token = Counts(TOKEN_LATENCY_BOUNDS_S)
        self.e2e_latency = Counts(REQUEST_LATENCY_BOUNDS_S)
        self.prompt_tokens = Counts(TOKEN_COUNT_BOUNDS)
        self.generation_tokens = Counts(TOKEN_COUNT_BOUNDS)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)

    def clock(self, arrived: float) -> "RequestClock":
        """The clock of a request that arrived at `arrived` (time.monotonic())."""
        return RequestClock(self, arrived)

    def snapshot(self, in_flight: int) -> RequestFigures:
        return RequestFigures(
            self.origin_id,
            self.time_to_first_token.wire(),
            self.inter_token_latency.wire(),
            self.time_per_output_token.wire(),
            self.e2e_latency.wire(),
            self.prompt_tokens.wire(),
            self.generation_tokens.wire(),
            self.prompt_tokens_total,
            self.generation_tokens_total,
            dict(self.finished),
            in_flight,
        )


class RequestClock:
    """One request's times as its origin sees them, counted into the origin's figures as they come.
    Invariant: a request's end is counted once, and a token only before it."""

    __slots__ = ("_figures", "_arrived", "_first_token", "_last_token", "_ended")

    def __init__(self, figures: OriginFigures, arrived: float) -> None:
        self._figures = figures
        self._arrived = arrived
        self._first_token: float | None = None
        self._last_token = 0.0
        self._ended = False

    def tokens(self, count: int, prompt_tokens: int, now: float | None = None) -> None:
        """`count` new tokens reached the request: the first ones give its time to first token
        (and count its prompt, now computed), each later delivery the time since the last."""
        if self._ended:
            return
        now = time.monotonic() if now is None else now
        figures = self._figures
        if self._first_token is None:
            self._first_token = now
            figures.time_to_first_token.observe(now - self._arrived)
            figures.prompt_tokens_total += prompt_tokens
        else:
            figures.inter_token_latency.observe(now - self._last_token)
        self._last_token = now
        figures.generation_tokens_total += count

    def end(self, reason: str, prompt_tokens: int, generation_tokens: int, now: float | None = None) -> None:
        """The request ended with `reason` after `generation_tokens`: counted once, later calls do nothing."""
        if self._ended:
            return
        self._ended = True
        now = time.monotonic() if now is None else now
        figures = self._figures
        if self._first_token is None and reason in ("stop", "length"):
            figures.prompt_tokens_total += prompt_tokens  # computed, though nothing was drawn (max_tokens 0)
        if self._first_token is not None and generation_tokens > 1:
            figures.time_per_output_token.observe((now - self._first_token) / (generation_tokens - 1))
        figures.e2e_latency.observe(now - self._arrived)
        figures.prompt_tokens.observe(prompt_tokens)
        figures.generation_tokens.observe(generation_tokens)
        figures.finished[reason] = figures.finished.get(reason, 0) + 1

    def forget(self) -> None:
        """The request was refused before it ran: it counts nowhere."""
        self._ended = True
