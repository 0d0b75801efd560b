"""`/metrics`: the figures users watch, in Prometheus' text format (prometheus-client writes it),
under vLLM's names and labels where the meaning is the same, so dashboards made for vLLM work.

Each figure comes from the actor that knows it, asked over the bus when the route is scraped:
the scheduler's queue, batch, KV blocks, prefix-cache counts and the KV tiers' figures (`GetStats`;
the disk tier's blocks and bytes as the cache_tier last told the scheduler), the executor's steps
and weight version (`DescribeExecutor`), and the request latencies and token counts of every origin
(`ReadRequestFigures`, which each frontdoor and gateway answers), added up. Asking at the scrape
costs nothing while nobody scrapes, shows each figure as of the scrape, and leaves the frontdoor
holding nothing another actor owns. A source that does not answer is left out (its
`kernel_llm:metrics_source_up` is 0), as Prometheus reads a missing series.
"""

import asyncio
from collections.abc import Iterable

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.request_figures import FINISH_REASONS
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.admin import GetStats, SchedulerStats, TierName
from schemas.errors import Error
from schemas.metrics import Histogram, ReadRequestFigures, RequestFigures
from schemas.step import DescribeExecutor, ExecutorInfo

ASK_TIMEOUT_S = 2.0  # each source's; Prometheus' own scrape timeout is 10 s by default
GATHER_TIMEOUT_S = 1.0  # for the origins: more than the heartbeats count alive may be gone
LABELS = ("model_name", "engine")  # vLLM's; one engine (a scheduler and its executor) per deployment
ENGINE = "0"
PROJECT = "kernel_llm:"  # this server's own figures
# Each tier's figures (schemas/admin.py:TierFigures): (name, field, kind, help). vLLM's per-tier
# offloading figures (`vllm:kv_offload_*`) change names from release to release: these are ours.
TIER_FAMILIES = (
    ("kv_tier_blocks", "blocks", "gauge", "KV blocks each tier of the cache holds (the GPU's: in its prefix cache)."),
    ("kv_tier_bytes", "bytes", "gauge", "Bytes of the KV blocks each tier holds (the disk's: its files)."),
    ("kv_tier_capacity_blocks", "capacity_blocks", "gauge", "KV blocks each tier has room for."),
    ("kv_tier_capacity_bytes", "capacity_bytes", "gauge", "Bytes each tier may hold."),
    ("kv_tier_pending_blocks", "pending_blocks", "gauge", "KV blocks on their way into each tier."),
    ("kv_tier_lookups", "lookups", "counter", "KV blocks of requests' first lookups each tier was asked for."),
    ("kv_tier_hits", "hits", "counter", "KV blocks of requests' first lookups each tier served."),
)


class Metrics:
    """Answers `/metrics` from what the scheduler, the executor and every origin say now."""

    def __init__(self, pipeline: RequestPipeline, bus: Bus, subjects: Subjects, model_name: str) -> None:
        self.pipeline = pipeline
        self.bus = bus
        self.subjects = subjects
        self.labels = [model_name, ENGINE]

    async def scrape(self, request: web.Request) -> web.Response:
        scheduler, executor, origins = await asyncio.gather(
            self.bus.request(self.subjects.admin_stats, GetStats(), SchedulerStats, ASK_TIMEOUT_S),
            self.bus.request(self.subjects.executor_describe, DescribeExecutor(), ExecutorInfo, ASK_TIMEOUT_S),
            self.bus.gather(
                self.subjects.metrics_origins,
                ReadRequestFigures(),
                RequestFigures,
                max(1, self.pipeline.live_origins),  # this one, before its own first heartbeat is back
                GATHER_TIMEOUT_S,
            ),
        )
        figures = [] if isinstance(origins, Error) else [o for o in origins if isinstance(o, RequestFigures)]
        families = [
            *self._origins(figures),
            *([] if isinstance(scheduler, Error) else self._scheduler(scheduler)),
            *([] if isinstance(executor, Error) else self._executor(executor)),
            self._sources_up(scheduler, executor),
        ]
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(Families(families)), headers={"Content-Type": content_type})

    def _origins(self, figures: list[RequestFigures]) -> Iterable:
        """The request figures of every origin that answered, added up: one scrape shows every
        request of the deployment, whichever frontdoor or gateway took it. None answered (the bus is
        down): the counts are left out, not shown as 0, which Prometheus would read as a reset."""
        yield self._gauge(
            PROJECT + "origins_reporting", "Origin processes (frontdoors, gateways) in this scrape.", len(figures)
        )
        if not figures:
            return
        yield self._histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", figures, "time_to_first_token_s"
        )
        itl = "Time between two deliveries of tokens to a request, in seconds."
        yield self._histogram("vllm:inter_token_latency_seconds", itl, figures, "inter_token_latency_s")
        # The same histogram under the older name that vLLM's example dashboard reads.
        yield self._histogram("vllm:time_per_output_token_seconds", itl, figures, "inter_token_latency_s")
        per_request = "Time per output token of a request after its first, in seconds."
        yield self._histogram(
            "vllm:request_time_per_output_token_seconds", per_request, figures, "time_per_output_token_s"
        )
        e2e = "End-to-end request latency in seconds, from its arrival to its end."
        yield self._histogram("vllm:e2e_request_latency_seconds", e2e, figures, "e2e_latency_s")
        yield self._histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", figures, "prompt_tokens")
        generated = "Generated tokens per request."
        yield self._histogram("vllm:request_generation_tokens", generated, figures, "generation_tokens")
        prompt = "Prompt tokens of the requests that computed their prompt."
        yield self._counter("vllm:prompt_tokens", prompt, sum(f.prompt_tokens_total for f in figures))
        generated = "Generated tokens delivered to requests."
        yield self._counter("vllm:generation_tokens", generated, sum(f.generation_tokens_total for f in figures))
        success = CounterMetricFamily(
            "vllm:request_success", "Requests ended, by finish reason.", labels=[*LABELS, "finished_reason"]
        )
        for reason in dict.fromkeys([*FINISH_REASONS, *(reason for f in figures for reason in f.finished)]):
            success.add_metric([*self.labels, reason], sum(f.finished.get(reason, 0) for f in figures))
        yield success
        in_flight = "Requests the origins hold: taken and not yet closed by their clients."
        yield self._gauge(PROJECT + "origin_requests_in_flight", in_flight, sum(f.in_flight for f in figures))

    def _scheduler(self, stats: SchedulerStats) -> Iterable:
        yield self._gauge("vllm:num_requests_running", "Requests in the running batch.", stats.running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", stats.waiting)
        # Blocks that only the prefix cache holds are free for the taking, as vLLM counts them.
        used = stats.total_blocks - stats.free_blocks - stats.evictable_blocks
        usage = used / stats.total_blocks if stats.total_blocks else 0.0
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        queries = "Prefix cache queries, in terms of number of queried tokens."
        yield self._counter("vllm:prefix_cache_queries", queries, stats.cache_queried_tokens)
        hits = "Prefix cache hits, in terms of number of cached tokens."
        yield self._counter("vllm:prefix_cache_hits", hits, stats.cache_hit_tokens)
        preempted = "Running requests sent back to the queue for lack of KV blocks."
        yield self._counter("vllm:num_preemptions", preempted, stats.preemptions)
        blocks = GaugeMetricFamily(
            PROJECT + "kv_blocks", "KV blocks of the GPU pool, by state.", labels=[*LABELS, "state"]
        )
        for state, count in (
            ("total", stats.total_blocks),
            ("free", stats.free_blocks),
            ("cached", stats.cached_blocks),
            ("evictable", stats.evictable_blocks),
        ):
            blocks.add_metric([*self.labels, state], count)
        yield blocks
        yield from self._tiers(stats)

    def _tiers(self, stats: SchedulerStats) -> Iterable:
        for name, field, kind, documentation in TIER_FAMILIES:
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
                PROJECT + name, documentation, labels=[*LABELS, "tier"]
            )
            for tier, figures in stats.tiers.items():
                family.add_metric([*self.labels, tier], getattr(figures, field))
            yield family
        offloaded: tuple[TierName, ...] = ("host", "disk")
        if any(tier in stats.tiers for tier in offloaded):  # as vLLM counts them for its KV connectors
            queries = "Prompt tokens looked up in the prefix cache while the host or disk tier could serve them."
            yield self._counter("vllm:external_prefix_cache_queries", queries, stats.cache_queried_tokens)
            hits = "Prompt tokens loaded from the host or disk tier instead of recomputed."
            yield self._counter("vllm:external_prefix_cache_hits", hits, stats.offload_hit_tokens)

    def _executor(self, info: ExecutorInfo) -> Iterable:
        yield self._counter(
            PROJECT + "executor_steps", "Steps the executor ran and published, since it started.", info.steps
        )
        version = InfoMetricFamily(PROJECT + "weight_version", "The version of the weights served.", labels=LABELS)
        version.add_metric(self.labels, {"version": info.weight_version})
        yield version

    def _sources_up(self, scheduler: SchedulerStats | Error, executor: ExecutorInfo | Error) -> GaugeMetricFamily:
        up = GaugeMetricFamily(
            PROJECT + "metrics_source_up", "Whether the source answered this scrape.", labels=[*LABELS, "source"]
        )
        up.add_metric([*self.labels, "scheduler"], 0 if isinstance(scheduler, Error) else 1)
        up.add_metric([*self.labels, "executor"], 0 if isinstance(executor, Error) else 1)
        return up

    def _histogram(
        self, name: str, documentation: str, figures: list[RequestFigures], field: str
    ) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=LABELS)
        merged = added_up([getattr(f, field) for f in figures])
        if merged is not None:
            cumulative, buckets = 0, []
            for bound, count in zip(merged.bounds, merged.counts):
                cumulative += count
                buckets.append((repr(float(bound)), cumulative))
            buckets.append(("+Inf", cumulative + merged.counts[-1]))
            family.add_metric(self.labels, buckets, merged.sum)
        return family

    def _counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=LABELS)
        family.add_metric(self.labels, value)
        return family

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=LABELS)
        family.add_metric(self.labels, value)
        return family


def added_up(histograms: list[Histogram]) -> Histogram | None:
    """The histograms of several origins as one, bucket by bucket; those with other bounds (an
    origin of another build) are left out, since their buckets do not line up. None if none."""
    if not histograms:
        return None
    first = histograms[0]
    same = [h for h in histograms if h.bounds == first.bounds]
    counts = [sum(column) for column in zip(*(h.counts for h in same))]
    return Histogram(first.bounds, counts, sum(h.sum for h in same))


class Families(Collector):
    """The families of one scrape, for prometheus-client's encoders."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> Iterable:
        return self.families
