"""The requests the benchmark sends and what it makes of their timings: shared by the in-process
driver and the HTTP clients, so both are judged by one definition of TTFT and inter-token latency.
"""

from dataclasses import dataclass, field

import numpy as np

from ops.bench.records import Percentiles, RunFigures
from schemas.generate import SamplingParams


@dataclass(frozen=True)
class Sampling:
    """How every request of a run draws its tokens; the default is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0  # 0: off
    # More SamplingParams fields every request sets (logprobs, per-token controls): --feature-cost.
    more: dict = field(default_factory=dict)

    def params(self, max_tokens: int) -> SamplingParams:
        """Exactly `max_tokens` tokens (EOS does not stop a request), drawn this way."""
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **self.fields())

    def fields(self) -> dict:
        """The sampling fields of a request, as an HTTP body or SamplingParams takes them."""
        return dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p, **self.more)

    def describe(self) -> str:
        if self.temperature <= 0:
            return "greedy"
        return (
            f"sampled: temperature {self.temperature}, top-p {self.top_p}, top-k {self.top_k if self.top_k > 0 else 'off'}, "
            f"min-p {self.min_p or 'off'}"
        )


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    output_tokens: int  # generated exactly (ignore_eos)


def random_requests(
    prompt_rng: np.random.Generator,
    length_rng: np.random.Generator,
    vocab_size: int,
    count: int,
    prompt_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
) -> list[BenchRequest]:
    """`count` requests with lengths uniform in the inclusive ranges and random prompt tokens."""
    prompts = length_rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, size=count)
    outputs = length_rng.integers(output_tokens[0], output_tokens[1] + 1, size=count)
    return [BenchRequest(prompt_rng.integers(0, vocab_size, int(p)).tolist(), int(o)) for p, o in zip(prompts, outputs)]


@dataclass(frozen=True)
class RequestTiming:
    ttft_s: float  # from sending (or submitting) to the first token's arrival
    itl_s: list[float]  # one gap per token after the first
    latency_s: float
    output_tokens: int
    taken_s: float = 0.0  # over HTTP, from sending to the server's response headers: it took the request

    @classmethod
    def from_chunks(cls, started: float, chunks: list[tuple[float, int]]) -> "RequestTiming":
        """`chunks`: (arrival time, tokens) in order. A chunk of k tokens spreads its gap over the
        k tokens, so a client that reads two steps at once does not show a zero inter-token gap."""
        if not chunks:
            raise ValueError("the request produced no tokens")
        itl: list[float] = []
        for (before, _), (at, tokens) in zip(chunks, chunks[1:]):
            itl += [(at - before) / tokens] * tokens
        first_at, first_tokens = chunks[0]
        itl += [0.0] * (first_tokens - 1)  # tokens that came with the first: no gap to see
        return cls(first_at - started, itl, chunks[-1][0] - started, sum(n for _, n in chunks))


def percentiles_ms(seconds: list[float]) -> Percentiles:
    if not seconds:
        return Percentiles(0.0, 0.0, 0.0, 0.0)
    p50, p90, p99 = np.percentile(np.asarray(seconds) * 1e3, [50, 90, 99]).tolist()
    return Percentiles(p50, p90, p99, float(np.mean(seconds) * 1e3))


def summarize(
    timings: list[RequestTiming], seconds: float, concurrency: int, requests: list[BenchRequest]
) -> RunFigures:
    """One run's figures, `timings` those of `requests`: prompt and output tokens/s over the whole
    run, TTFT and ITL percentiles in ms."""
    produced = sum(t.output_tokens for t in timings)
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    return RunFigures(
        concurrency=concurrency,
        requests=len(timings),
        input_tokens=prompt_tokens,
        output_tokens=produced,
        seconds=seconds,
        input_tok_s=prompt_tokens / seconds,
        output_tok_s=produced / seconds,
        ttft_ms=percentiles_ms([t.ttft_s for t in timings]),
        itl_ms=percentiles_ms([gap for t in timings for gap in t.itl_s]),
        latency_ms=percentiles_ms([t.latency_s for t in timings]),
        taken_ms=percentiles_ms([t.taken_s for t in timings]),
        last_taken_ms=max((t.taken_s for t in timings), default=0.0) * 1e3,
    )
