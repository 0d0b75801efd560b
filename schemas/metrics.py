"""The figures of `/metrics` that only the origins know: the frontdoor asks every origin (each
frontdoor and gateway) with one `ReadRequestFigures` on `<ns>.metrics.origins` and adds up the
`RequestFigures` they answer. The scheduler's and the executor's figures travel in their own
replies (`schemas/admin.py:SchedulerStats`, `schemas/step.py:ExecutorInfo`).
"""

import msgspec


class ReadRequestFigures(msgspec.Struct, frozen=True, tag="read_request_figures"):
    pass


class Histogram(msgspec.Struct, frozen=True):
    """Observations counted per bucket: `counts[i]` those <= `bounds[i]` and above the bound
    before it, the last count those above every bound (not cumulative, unlike Prometheus')."""

    bounds: list[float]
    counts: list[int]
    sum: float


class RequestFigures(msgspec.Struct, frozen=True, tag="request_figures"):
    """What one origin counted of the requests it took, since it started. Each of a request's n
    choices counts as a request, as each runs as one downstream."""

    origin_id: str
    time_to_first_token_s: Histogram
    inter_token_latency_s: Histogram  # between two deliveries of tokens to one request
    time_per_output_token_s: Histogram  # per request: from its first token to its end, per later token
    e2e_latency_s: Histogram  # from its arrival at the origin to its end
    prompt_tokens: Histogram  # per ended request
    generation_tokens: Histogram  # per ended request
    prompt_tokens_total: int  # of the requests that computed their prompt: a token came, or a stop or length end
    generation_tokens_total: int  # as they were delivered
    finished: dict[str, int]  # finish reason -> requests ended so ("stop", "length", "abort", "error")
    in_flight: int  # requests taken and not yet closed by their clients
