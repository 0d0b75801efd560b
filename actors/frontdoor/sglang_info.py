"""The health, info and load routes that clients written for SGLang poll: `/health_generate` (one
token through every actor), `/server_info` and `/get_server_info`, `/model_info` and
`/get_model_info`, `/v1/loads` and the older `/get_load`, in SGLang's shapes (its http_server.py)
with the fields this server has. The load comes from the scheduler's stats; the weight version and
the checkpoint last loaded from disk from the weight_sync actor, which owns them.
"""

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from aiohttp import web

from actors.frontdoor.http_errors import error_response
from actors.frontdoor.request_fields import invalid
from actors.lib.origin.held_requests import describe
from actors.lib.origin.pipeline import PIPELINE_ACTORS, RequestPipeline
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.admin import GetStats, SchedulerStats
from schemas.admin_weights import GetWeightVersion, WeightVersion
from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams

HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's
STATS_TIMEOUT_S = 5.0
VERSION = "0.1.0"
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})  # SGLang's names


@dataclass(frozen=True)
class ServerFacts:
    """What the configuration says about the server, for the info routes."""

    model_name: str
    model_path: str
    block_size: int
    max_running_requests: int
    max_prefill_tokens: int
    context_length: int | None  # None: the model's own
    deterministic: bool = False  # --deterministic: batch-invariant kernels


class SGLangInfo:
    def __init__(self, pipeline: RequestPipeline, bus: Bus, subjects: Subjects, facts: ServerFacts) -> None:
        self.pipeline = pipeline
        self.bus = bus
        self.subjects = subjects
        self.facts = facts

    async def health_generate(self, _request: web.Request) -> web.Response:
        """200 once one token went through the tokenizer, scheduler and executor; else 503."""
        # A probe answers now: it is not held, as requests are, until the actors are ready.
        if reasons := self.pipeline.not_ready(PIPELINE_ACTORS):
            return error_response(
                Error("unavailable", f"health check failed: not ready ({describe(reasons)})", retriable=True)
            )
        probe = GenerateRequest(input_ids=[0], params=SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        group = await self.pipeline.submit(probe)
        if isinstance(group, Error):
            return error_response(Error("unavailable", f"health check failed: {group.message}", retriable=True))
        try:
            async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT_S):
                async for _, output in group:
                    if output.error:
                        return error_response(Error("unavailable", output.error.message, retriable=True))
        except TimeoutError:
            return error_response(Error("unavailable", "health check timed out", retriable=True))
        finally:
            await group.close()
        return web.Response(status=200)

    async def model_info(self, _request: web.Request) -> web.Response:
        facts = self.facts
        weights = await self.weights()
        if isinstance(weights, Error):
            return error_response(weights)
        return web.json_response(
            {
                "model_path": weights.model_path or facts.model_path,
                "tokenizer_path": facts.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": weights.weight_version,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "served_model_name": facts.model_name,
            }
        )

    async def server_info(self, _request: web.Request) -> web.Response:
        stats = await self._stats()
        if isinstance(stats, Error):
            return error_response(stats)
        facts = self.facts
        load = self._load(stats)
        weights = await self.weights()
        if isinstance(weights, Error):
            return error_response(weights)
        return web.json_response(
            {
                "model_path": weights.model_path or facts.model_path,
                "tokenizer_path": facts.model_path,
                "served_model_name": facts.model_name,
                "tp_size": 1,
                "dp_size": 1,
                "page_size": facts.block_size,
                "context_length": facts.context_length,
                "max_running_requests": facts.max_running_requests,
                "chunked_prefill_size": facts.max_prefill_tokens,
                "max_total_num_tokens": load["max_total_num_tokens"],
                "weight_version": weights.weight_version,
                "enable_deterministic_inference": facts.deterministic,  # SGLang's name for it
                "internal_states": [load],
                "version": VERSION,
            }
        )

    async def loads(self, request: web.Request) -> web.Response:
        """`?include=` takes SGLang's sections; this server reports the core one whatever is asked."""
        include = {s.strip() for s in request.query.get("include", "").split(",") if s.strip()}
        if not include <= LOAD_SECTIONS:
            return error_response(invalid(f"unknown include sections: {sorted(include - LOAD_SECTIONS)}", "include"))
        stats = await self._stats()
        if isinstance(stats, Error):
            return error_response(stats)
        load = self._load(stats)
        aggregate = {
            "total_running_reqs": load["num_running_reqs"],
            "total_waiting_reqs": load["num_waiting_reqs"],
            "total_reqs": load["num_total_reqs"],
            "total_used_tokens": load["num_used_tokens"],
            "total_tokens": load["max_total_num_tokens"],
            "avg_token_usage": load["token_usage"],
        }
        return web.json_response(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": VERSION,
                "dp_rank_count": 1,
                "loads": [load],
                "aggregate": aggregate,
            }
        )

    async def get_load(self, _request: web.Request) -> web.Response:
        stats = await self._stats()
        if isinstance(stats, Error):
            return error_response(stats)
        load = self._load(stats)
        return web.json_response(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                    "num_waiting_reqs": load["num_waiting_reqs"],
                    "num_tokens": load["num_used_tokens"],
                    "num_pending_tokens": 0,
                    "ts_tic": time.perf_counter(),
                }
            ]
        )

    async def weights(self) -> WeightVersion | Error:
        return await serving_weights(self.bus, self.subjects)

    async def _stats(self) -> SchedulerStats | Error:
        return await self.bus.request(self.subjects.admin_stats, GetStats(), SchedulerStats, STATS_TIMEOUT_S)

    def _load(self, stats: SchedulerStats) -> dict:
        """SGLang's core load fields. Cached blocks nobody reads are free for the taking: not in use."""
        block = self.facts.block_size
        total = stats.total_blocks * block
        used = (stats.total_blocks - stats.free_blocks - stats.evictable_blocks) * block
        queried = stats.cache_queried_tokens
        return {
            "dp_rank": 0,
            "num_running_reqs": stats.running,
            "num_waiting_reqs": stats.waiting,
            "num_total_reqs": stats.running + stats.waiting,
            "num_used_tokens": used,
            "num_total_tokens": total,
            "max_total_num_tokens": total,
            "max_running_requests": self.facts.max_running_requests,
            "token_usage": used / total if total else 0.0,
            "cache_hit_rate": stats.cache_hit_tokens / queried if queried else 0.0,
            "utilization": stats.running / self.facts.max_running_requests,
        }


async def serving_weights(bus: Bus, subjects: Subjects) -> WeightVersion | Error:
    """What weights serve now, as the weight_sync actor tells; while it restarts, a retriable
    Error (503), never a guess: an update may have changed them."""
    return await bus.request(subjects.admin_weights, GetWeightVersion(), WeightVersion, STATS_TIMEOUT_S)
