"""Serving the other chat dialects (OpenAI's Responses API, Anthropic's Messages): a request already
translated onto the chat path goes through the origin like a chat completion, and its reply is read
by the same `ReplyReader` (thinking, text, tool calls); a dialect's `ReplyWriter` only gives the
pieces its own shape, as one JSON body or as typed server-sent events.

One choice per request: neither dialect has `n`. A client that goes away cancels the handler, and
closing the group aborts the request downstream, as for chat.
"""

from dataclasses import dataclass
from typing import Protocol

import msgspec
from aiohttp import web

from actors.frontdoor.openai_protocol import ParsedRequest
from actors.frontdoor.openai_serving import SSE_HEADERS
from actors.frontdoor.tenants import Tenants
from actors.lib.chat_reply import ReplyDelta, ReplyReader
from actors.lib.origin.pipeline import RequestPipeline
from schemas.errors import Error

_json = msgspec.json.Encoder()


@dataclass(frozen=True)
class Ending:
    """How a reply ended, as the origin saw it, and what it cost."""

    finish_reason: str  # "stop", "length" or "abort"
    matched_stop: int | str | None  # with "stop": the stop token id or string met, if any
    input_tokens: int
    output_tokens: int
    cached_tokens: int


class ReplyWriter(Protocol):
    """One reply in a dialect's shape. A stream's events are (event name, data) pairs, in order."""

    def start(self) -> list[tuple[str, dict]]: ...

    def add(self, delta: ReplyDelta) -> list[tuple[str, dict]]: ...

    def end(self, ending: Ending) -> list[tuple[str, dict]]: ...

    def fail(self, error: Error) -> list[tuple[str, dict]]: ...

    def whole(self, reply: ReplyDelta, ending: Ending) -> dict: ...


class Dialect(Protocol):
    def error_response(self, error: Error) -> web.Response: ...

    def writer(self, request_id: str, created: int, input_tokens: int) -> ReplyWriter: ...


def sse(event: str, data: dict) -> bytes:
    """A typed event: both dialects name it on the `event:` line and again in the data's `type`."""
    return b"event: " + event.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


class DialectServing:
    def __init__(self, pipeline: RequestPipeline, tenants: Tenants, max_concurrent: int) -> None:
        self.pipeline = pipeline
        self.tenants = tenants
        self.max_concurrent = max_concurrent

    async def serve(self, request: web.Request, parsed: ParsedRequest | Error, dialect: Dialect) -> web.StreamResponse:
        if isinstance(parsed, Error):
            return dialect.error_response(parsed)
        if self.pipeline.in_flight >= self.max_concurrent:
            message = f"more than {self.max_concurrent} requests in flight; retry later"
            return dialect.error_response(Error("overloaded", message, retriable=True))
        tenant = self.tenants.request_tenant(request["identity"], parsed.user)
        group = await self.pipeline.submit(parsed.request, tenant=tenant)
        if isinstance(group, Error):
            return dialect.error_response(group)
        try:
            # A reader even for a plain reply: it hands the text over as content, so every reply
            # arrives in the same pieces.
            reader = ReplyReader(parsed.reply, group.prompt_ids)
            writer = dialect.writer(group.request_id, int(group.created), len(group.prompt_ids))
            if parsed.request.stream:
                return await self._stream(request, group, reader, writer)
            return await self._whole(group, reader, writer, dialect)
        finally:
            await group.close()

    async def _whole(self, group, reader: ReplyReader, writer: ReplyWriter, dialect: Dialect) -> web.Response:
        texts, ending = [], None
        async for _, output in group:
            if output.error:
                return dialect.error_response(output.error)
            texts.append(output.text)
            if output.finish_reason:
                ending = _ending(output, len(group.prompt_ids), group.cached_tokens)
        if ending is None:  # the origin always ends a request; a missing end is a bug downstream
            return dialect.error_response(Error("internal", "the request ended without a finish reason"))
        body = writer.whole(reader.push("".join(texts), final=True), ending)
        return web.Response(body=_json.encode(body), content_type="application/json")

    async def _stream(self, request: web.Request, group, reader: ReplyReader, writer: ReplyWriter):
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        for event in writer.start():
            await response.write(sse(*event))
        async for _, output in group:
            if output.error:
                events = writer.fail(output.error)
            else:
                final = output.finish_reason is not None
                events = writer.add(reader.push(output.text, final=final))
                if final:
                    events += writer.end(_ending(output, len(group.prompt_ids), group.cached_tokens))
            for event in events:
                await response.write(sse(*event))
            if output.error:
                break
        await response.write_eof()
        return response


def _ending(output, input_tokens: int, cached_tokens: int | None) -> Ending:
    return Ending(output.finish_reason, output.matched_stop, input_tokens, output.completion_tokens, cached_tokens or 0)
