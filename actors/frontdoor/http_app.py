"""The HTTP front door: OpenAI-compatible routes, the native `/generate`, and `/health`.

Handlers parse with `openai_protocol` or `native_protocol`, run the request through the pipeline,
and write either one JSON body or a stream of server-sent events. A client that goes away
mid-request cancels its handler (or fails its next write), and closing the stream aborts the
request downstream.
"""

import time

import msgspec
import structlog
from aiohttp import web

from actors.frontdoor import native_protocol as native
from actors.frontdoor import openai_protocol as protocol
from actors.frontdoor.openapi import openapi_document
from actors.frontdoor.request_fields import ParsedRequest
from actors.frontdoor.tenants import Tenants
from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.request_stream import RequestGroup
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
from schemas.errors import Error
from schemas.session import AsTenant, CloseSession, OpenSession, SessionClosed, SessionOpened

log = structlog.get_logger()


PIPELINE_ACTORS = ("tokenizer", "scheduler", "executor")
RETRY_AFTER_S = 1
ADMIN_TIMEOUT_S = 5.0
SESSION_TIMEOUT_S = 5.0


def error_response(error: Error) -> web.Response:
    return web.json_response(protocol.error_body(error), status=error.http_status)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """aiohttp's own errors (unknown route, wrong method, body too large) in OpenAI's error shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 413: "payload_too_large"}.get(exc.status, "invalid_request")
        return web.json_response(protocol.error_body(Error(code, exc.reason)), status=exc.status)


class HttpApi:
    """Generation goes through the origin's `pipeline`; the admin and session routes are plain
    requests to the scheduler over the frontdoor's `bus`."""

    def __init__(
        self,
        pipeline: RequestPipeline,
        bus: Bus,
        subjects: Subjects,
        tenants: Tenants,
        model_name: str,
        max_body_bytes: int,
        max_concurrent_requests: int,
    ) -> None:
        self.pipeline = pipeline
        self.bus = bus
        self.subjects = subjects
        self.tenants = tenants
        self.model_name = model_name
        self.max_body_bytes = max_body_bytes
        self.max_concurrent_requests = max_concurrent_requests
        self.openapi_document = openapi_document()
        self.created = int(time.time())

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[errors_as_json, self.identify], client_max_size=self.max_body_bytes)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health/ready", self.ready)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/sessions", self.open_session)
        app.router.add_delete("/v1/sessions/{session_id}", self.close_session)
        app.router.add_get("/admin/stats", self.stats)
        app.router.add_post("/admin/flush_cache", self.flush_cache)
        app.router.add_get("/admin/cache", self.cache_report)
        app.router.add_post("/admin/publish", self.publish_prefix)
        app.router.add_get("/openapi.json", self.openapi)
        return app

    @web.middleware
    async def identify(self, request: web.Request, handler):
        identity = self.tenants.identify(request.path, request.headers.get("Authorization"))
        if isinstance(identity, Error):
            return error_response(identity)
        request["identity"] = identity
        return await handler(request)

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def openapi(self, _request: web.Request) -> web.Response:
        return web.json_response(self.openapi_document)

    async def ready(self, _request: web.Request) -> web.Response:
        """Ready when every actor a request passes through has a live, ready instance now."""
        missing = self.pipeline.not_ready(PIPELINE_ACTORS)
        if missing:
            return web.json_response({"status": "unavailable", "not_ready": missing}, status=503)
        return web.json_response({"status": "ready"})

    async def stats(self, _request: web.Request) -> web.Response:
        return await self._admin(self.subjects.admin_stats, GetStats(), SchedulerStats)

    async def flush_cache(self, _request: web.Request) -> web.Response:
        return await self._admin(self.subjects.admin_flush_cache, FlushCache(), CacheFlushed)

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

    async def _admin(self, subject: str, message, reply_type) -> web.Response:
        """Admin routes are the bus's admin conversations, answered as JSON."""
        reply = await self.bus.request(subject, message, reply_type, ADMIN_TIMEOUT_S)
        if isinstance(reply, Error):
            return error_response(reply)
        return web.json_response(msgspec.to_builtins(reply))

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(protocol.models_response(self.model_name, self.created))

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
        return await self._serve(request, protocol.parse_chat_request(await request.read(), self.model_name))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, protocol.parse_completion_request(await request.read(), self.model_name))

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, native.parse_generate_request(await request.read()))

    async def _serve(self, request: web.Request, parsed: ParsedRequest | Error) -> web.StreamResponse:
        if isinstance(parsed, Error):
            return error_response(parsed)
        if self.pipeline.in_flight >= self.max_concurrent_requests:
            response = error_response(
                Error(
                    "overloaded",
                    f"more than {self.max_concurrent_requests} requests in flight; retry later",
                    retriable=True,
                )
            )
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            return response
        tenant = self.tenants.request_tenant(request["identity"], parsed.user)
        group = await self.pipeline.submit(parsed.request, tenant=tenant)
        if isinstance(group, Error):
            return error_response(group)
        try:
            if parsed.request.stream:
                return await self._stream_events(request, parsed, group)
            return await self._whole_response(parsed, group)
        finally:
            await group.close()

    async def _whole_response(self, parsed: ParsedRequest, group: RequestGroup) -> web.Response:
        texts: list[list[str]] = [[] for _ in group.choices]
        token_ids: list[list[int]] = [[] for _ in group.choices]
        finishes: list[str] = [""] * len(group.choices)
        completion_tokens = 0
        async for index, output in group:
            if output.error:
                return error_response(output.error)
            texts[index].append(output.text)
            token_ids[index] += output.token_ids
            if output.finish_reason:
                finishes[index] = output.finish_reason
                completion_tokens += output.completion_tokens
        choices = [("".join(text), finish) for text, finish in zip(texts, finishes)]
        return web.json_response(self._final_body(parsed.kind, group, choices, token_ids[0], completion_tokens))

    def _final_body(
        self,
        kind: str,
        group: RequestGroup,
        choices: list[tuple[str, str]],
        token_ids: list[int],
        completion_tokens: int,
    ) -> dict:
        args = (
            group.request_id,
            self.model_name,
            self.created,
            choices,
            len(group.prompt_ids),
            completion_tokens,
            group.cached_tokens,
        )
        if kind == "chat":
            return protocol.chat_completion_response(*args)
        if kind == "completion":
            return protocol.completion_response(*args)
        ((text, finish),) = choices  # the native route has no n
        return {
            "request_id": group.request_id,
            "text": text,
            "token_ids": token_ids,
            "finish_reason": finish,
            "prompt_tokens": len(group.prompt_ids),
            "completion_tokens": completion_tokens,
            "cached_tokens": group.cached_tokens,
        }

    async def _stream_events(
        self, request: web.Request, parsed: ParsedRequest, group: RequestGroup
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        kind, rid, model, created = parsed.kind, group.request_id, self.model_name, self.created
        if kind == "chat":
            for index in range(len(group.choices)):
                await response.write(
                    protocol.sse_event(protocol.chat_chunk(rid, model, created, role="assistant", index=index))
                )
        completion_tokens = 0
        async for index, output in group:
            if output.error:
                await response.write(protocol.sse_event(protocol.error_body(output.error)))
                break
            if output.text or output.finish_reason or (kind == "generate" and output.token_ids):
                await response.write(protocol.sse_event(self._chunk(kind, rid, index, output)))
            if output.finish_reason:
                completion_tokens += output.completion_tokens
        else:
            if parsed.include_usage_in_stream:
                usage = protocol.usage_chunk(
                    kind, rid, model, created, len(group.prompt_ids), completion_tokens, group.cached_tokens
                )
                await response.write(protocol.sse_event(usage))
        await response.write(protocol.SSE_DONE)
        await response.write_eof()
        return response

    def _chunk(self, kind: str, rid: str, index: int, output) -> dict:
        model, created = self.model_name, self.created
        if kind == "chat":
            return protocol.chat_chunk(
                rid, model, created, delta_text=output.text, finish_reason=output.finish_reason, index=index
            )
        if kind == "completion":
            return protocol.completion_chunk(rid, model, created, output.text, output.finish_reason, index=index)
        return {
            "request_id": rid,
            "text": output.text,
            "token_ids": output.token_ids,
            "finish_reason": output.finish_reason,
            "completion_tokens": output.completion_tokens,
        }
