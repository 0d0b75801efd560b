"""The HTTP front door: the routes, the admin and session conversations, and `/health`.

OpenAI's chat and completions are served by `openai_serving`, OpenAI's Responses API and
Anthropic's Messages (translated onto the chat path) by `dialect_serving`, embeddings and scores (`/v1/embeddings`,
SGLang's `/encode`, `/v1/score`, `/v1/similarity`) by `embedding_serving`, SGLang's native `/generate` and
`/abort_request` by `sglang_serving`, the health, info and load routes SGLang's clients poll by
`sglang_info`, pausing generation by `pause_routes`, live weights by `weight_routes`, sleep, wake
and cache flushes by `memory_routes`, and Prometheus' `/metrics` by `metrics`; the admin and
session routes here are plain requests to the scheduler.
"""

import time

import msgspec
import structlog
from aiohttp import web

from actors.frontdoor import native_protocol as native
from actors.frontdoor import openai_protocol as protocol
from actors.frontdoor.anthropic_messages import parse_messages_request
from actors.frontdoor.anthropic_output import AnthropicDialect
from actors.frontdoor.dialect_serving import DialectServing
from actors.frontdoor.embedding_serving import EmbeddingServing
from actors.frontdoor.http_errors import error_response, errors_as_json
from actors.frontdoor.memory_routes import MemoryRoutes
from actors.frontdoor.metrics import Metrics
from actors.frontdoor.openai_responses import models_response
from actors.frontdoor.openai_serving import OpenAIServing
from actors.frontdoor.openapi import ModelFacts, openapi_document
from actors.frontdoor.pause_routes import PauseRoutes
from actors.frontdoor.responses_api import parse_responses_request
from actors.frontdoor.responses_output import ResponsesDialect
from actors.frontdoor.sglang_info import ServerFacts, SGLangInfo
from actors.frontdoor.sglang_serving import SGLangServing
from actors.frontdoor.tenants import Tenants
from actors.frontdoor.weight_routes import WeightRoutes
from actors.lib.chat_format import ChatFormat
from actors.lib.origin.pipeline import PIPELINE_ACTORS, RequestPipeline
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.admin import (
    CacheFlushed,
    CacheReport,
    FlushCache,
    GetCache,
    GetStats,
    PrefixPublished,
    PublishPrefix,
    SchedulerStats,
)
from schemas.embed import Pooling
from schemas.errors import Error
from schemas.session import AsTenant, CloseSession, OpenSession, SessionClosed, SessionOpened
from schemas.step import DescribeExecutor, ExecutorInfo

log = structlog.get_logger()


ADMIN_TIMEOUT_S = 5.0
# A flush of the disk tier waits for the disk work asked before it, which the scheduler waits a minute for.
FLUSH_TIMEOUT_S = 65.0
SESSION_TIMEOUT_S = 5.0


class HttpApi:
    """Generation goes through the origin's `pipeline`; the admin and session routes are plain
    requests to the scheduler over the frontdoor's `bus`."""

    def __init__(
        self,
        pipeline: RequestPipeline,
        bus: Bus,
        subjects: Subjects,
        tenants: Tenants,
        facts: ServerFacts,
        max_body_bytes: int,
        max_concurrent_requests: int,
        incremental_streaming: bool = False,
        chat_format: ChatFormat = ChatFormat(),
        embedding_pooling: Pooling = "last",
    ) -> None:
        self.pipeline = pipeline
        self.chat_format = chat_format  # what the model writes beside its answers: tool calls, thinking
        self.bus = bus
        self.subjects = subjects
        self.tenants = tenants
        self.model_name = facts.model_name
        self.max_body_bytes = max_body_bytes
        self.model_facts: ModelFacts | None = None  # the executor's, once it has answered
        self.started = int(time.time())
        self.openai = OpenAIServing(pipeline, tenants, facts.model_name, max_concurrent_requests)
        self.dialects = DialectServing(pipeline, tenants, max_concurrent_requests)
        self.sglang = SGLangServing(pipeline, tenants, max_concurrent_requests, incremental_streaming)
        self.embeddings = EmbeddingServing(
            pipeline, tenants, facts.model_name, max_concurrent_requests, embedding_pooling
        )
        self.info = SGLangInfo(pipeline, bus, subjects, facts)
        self.pause = PauseRoutes(bus, subjects)
        self.weights = WeightRoutes(bus, subjects)
        self.memory = MemoryRoutes(bus, subjects)
        self.metrics = Metrics(pipeline, bus, subjects, facts.model_name)

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[errors_as_json, self.identify], client_max_size=self.max_body_bytes)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health/ready", self.ready)
        app.router.add_get("/metrics", self.metrics.scrape)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/embeddings", self.embeddings.embeddings)
        app.router.add_post("/encode", self.embeddings.encode)
        app.router.add_post("/v1/score", self.embeddings.score)
        app.router.add_post("/v1/similarity", self.embeddings.similarity)
        app.router.add_post("/generate", self.sglang.generate)
        app.router.add_post("/abort_request", self.sglang.abort_request)
        app.router.add_get("/health_generate", self.info.health_generate)
        for path, handler in (
            ("/server_info", self.info.server_info),
            ("/get_server_info", self.info.server_info),
            ("/model_info", self.info.model_info),
            ("/get_model_info", self.info.model_info),
            ("/v1/loads", self.info.loads),
            ("/get_load", self.info.get_load),
        ):
            app.router.add_get(path, handler)
        app.router.add_post("/v1/sessions", self.open_session)
        app.router.add_delete("/v1/sessions/{session_id}", self.close_session)
        app.router.add_get("/admin/stats", self.stats)
        app.router.add_post("/admin/flush_cache", self.flush_cache)
        app.router.add_get("/admin/cache", self.cache_report)
        app.router.add_post("/admin/publish", self.publish_prefix)
        for routes in (self.pause, self.weights, self.memory):
            routes.add_to(app.router)
        app.router.add_get("/openapi.json", self.openapi)
        return app

    @web.middleware
    async def identify(self, request: web.Request, handler):
        # Anthropic's clients send their key as `x-api-key`.
        api_key = request.headers.get("x-api-key")
        authorization = request.headers.get("Authorization") or (f"Bearer {api_key}" if api_key else None)
        identity = self.tenants.identify(request.path, authorization)
        if isinstance(identity, Error):
            return error_response(identity)
        request["identity"] = identity
        return await handler(request)

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def openapi(self, _request: web.Request) -> web.Response:
        """The document, its token ids bounded by the served vocabulary once the executor has told
        it (asked until then, and kept: a restart serves the same model)."""
        if self.model_facts is None:
            info = await self.bus.request(
                self.subjects.executor_describe, DescribeExecutor(), ExecutorInfo, ADMIN_TIMEOUT_S
            )
            if isinstance(info, ExecutorInfo):
                self.model_facts = ModelFacts(info.vocab_size, info.max_model_len)
        return web.json_response(openapi_document(self.model_name, self.model_facts, self.tenants.needs_key))

    async def ready(self, _request: web.Request) -> web.Response:
        """Ready when every actor a request passes through has a live, ready instance now; else 503
        naming each that has none, and why (`reasons`: a stuck actor's own words)."""
        reasons = self.pipeline.not_ready(PIPELINE_ACTORS)
        if reasons:
            body = {"status": "unavailable", "not_ready": list(reasons), "reasons": reasons}
            return web.json_response(body, status=503)
        return web.json_response({"status": "ready"})

    async def stats(self, _request: web.Request) -> web.Response:
        return await self._admin(self.subjects.admin_stats, GetStats(), SchedulerStats)

    async def flush_cache(self, request: web.Request) -> web.Response:
        """No body (the GPU's prefix cache) or {"tier": "gpu" | "host" | "disk" | "all"}."""
        body = native.parse_flush_body(await request.read())
        if isinstance(body, Error):
            return error_response(body)
        return await self._admin(self.subjects.admin_flush_cache, FlushCache(body.tier), CacheFlushed, FLUSH_TIMEOUT_S)

    async def cache_report(self, _request: web.Request) -> web.Response:
        return await self._admin(self.subjects.admin_cache, GetCache(), CacheReport)

    async def publish_prefix(self, request: web.Request) -> web.Response:
        """{"text": ...} (encoded as a completions prompt is) or {"input_ids": [...]}."""
        parsed = native.parse_publish_request(await request.read())
        if isinstance(parsed, Error):
            return error_response(parsed)
        encoded = await self.pipeline.encode(parsed)
        if isinstance(encoded, Error):
            return error_response(encoded)
        return await self._admin(self.subjects.admin_publish, PublishPrefix(encoded.token_ids), PrefixPublished)

    async def _admin(self, subject: str, message, reply_type, timeout_s: float = ADMIN_TIMEOUT_S) -> web.Response:
        """Admin routes are the bus's admin conversations, answered as JSON."""
        reply = await self.bus.request(subject, message, reply_type, timeout_s)
        if isinstance(reply, Error):
            return error_response(reply)
        return web.json_response(msgspec.to_builtins(reply))

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(models_response(self.model_name, self.started))

    async def open_session(self, request: web.Request) -> web.Response:
        body = native.parse_session_body(await request.read())
        if isinstance(body, Error):
            return error_response(body)
        tenant = self.tenants.request_tenant(request["identity"], body.user or "")
        message = AsTenant(tenant, OpenSession(body.user or "", body.capacity_tokens, body.idle_timeout_s))
        reply = await self.bus.request(self.subjects.scheduler, message, SessionOpened, SESSION_TIMEOUT_S)
        if isinstance(reply, Error):
            return error_response(reply)
        return web.json_response(
            {
                "id": reply.session_id,
                "object": "session",
                "created": int(time.time()),
                "capacity_tokens": reply.capacity_tokens,
                "idle_timeout_s": reply.idle_timeout_s,
            }
        )

    async def close_session(self, request: web.Request) -> web.Response:
        """The session's owner is the tenant, narrowed by `?user=` as it was when it was opened."""
        user = request.query.get("user", "")
        tenant = self.tenants.request_tenant(request["identity"], user)
        message = AsTenant(tenant, CloseSession(request.match_info["session_id"], user))
        reply = await self.bus.request(self.subjects.scheduler, message, SessionClosed, SESSION_TIMEOUT_S)
        if isinstance(reply, Error):
            return error_response(reply)
        return web.json_response({"id": reply.session_id, "object": "session", "deleted": True})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        parsed = protocol.parse_chat_request(await request.read(), self.model_name, self.chat_format)
        return await self.openai.serve(request, parsed)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        parsed = protocol.parse_completion_request(await request.read(), self.model_name)
        return await self.openai.serve(request, parsed)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's Responses API, stateless, on the chat path (responses_api.py)."""
        parsed = parse_responses_request(await request.read(), self.model_name, self.chat_format)
        if isinstance(parsed, Error):
            return error_response(parsed)
        return await self.dialects.serve(request, parsed.chat, ResponsesDialect(parsed, self.model_name))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages API on the chat path (anthropic_messages.py), in Anthropic's shapes."""
        parsed = parse_messages_request(await request.read(), self.model_name, self.chat_format)
        if isinstance(parsed, Error):
            return AnthropicDialect(self.model_name, []).error_response(parsed)
        dialect = AnthropicDialect(self.model_name, parsed.stop_sequences, parsed.params)
        return await self.dialects.serve(request, parsed.chat, dialect)
