"""The public bus API: `<ns>.generate` request/reply for other services; with API keys,
`<ns>.generate.<tenant>`, where the subject names the tenant and `user` only narrows within it.

A request with `stream` set gets `GenerateChunk`s at its reply inbox, numbered 0, 1, 2..., then a
`GenerateResult` for each of its n choices; otherwise just the results. A failure is one `Error`.

A chat request (`messages`) takes `tool_choice` and `parallel_tool_calls` and has its replies read
as the HTTP chat route does (chat_replies.py): a demanded call decoded under its grammar, thinking
and tool calls apart from the answer, in every chunk and in the result.

A bus outage (a restarted nats-server) can lose replies in flight, so the gateway keeps what it sent
each request until a while after its end. A client that sees a gap in the numbering, or silence,
sends the same request again with the `request_id` from its chunks (or one it chose) and
`resume_from` set to the next number it expects: the gateway replays from there and streams on to
the new reply inbox. Asking again is harmless, so a client may do it whenever in doubt.

An `AbortGenerate` on the same subject ends requests keeping what they generated: each ends with a
result of finish_reason "abort" holding every token so far (and their logprobs, when asked for).
An `EmbedRequest` or a `ScoreRequest` (schemas/embed.py) gets one reply, an `EmbedResult` or a
`ScoreResult` (or an `Error`); asking again computes it again.
"""

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import structlog

from actors.gateway.chat_replies import ChoiceReply, chat_request
from actors.lib.chat_format import ChatFormat
from actors.lib.chat_reply import ReplyOptions
from actors.lib.origin.embeddings import embed
from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.request_stream import RequestGroup
from actors.lib.origin.scoring import score
from kernel.bus import Bus
from kernel.tenants import request_tenant
from schemas.embed import EmbedRequest, EmbedResult, Pooling, PublicRequest, ScoreRequest
from schemas.errors import Error
from schemas.generate import AbortGenerate, GenerateChunk, GenerateRequest, GenerateResult
from schemas.requests import Aborted, RequestOutput, Tenant

log = structlog.get_logger()
KEEP_FINISHED_S = 120.0  # how long a client may still ask for the replies of a finished request
FORGET_INTERVAL_S = 5.0


@dataclass
class BusStream:
    """Every reply one request has been sent, so that any of them can be sent again."""

    reply_to: str
    chunks: list[GenerateChunk] = field(default_factory=list)
    finals: list[GenerateResult] | list[Error] = field(default_factory=list)  # a result per choice, or one error
    finished_at: float | None = None
    tenant: str | None = None  # whose request it is (None without API keys): only that tenant may resume it


class BusApi:
    def __init__(
        self,
        bus: Bus,
        pipeline: RequestPipeline,
        model_name: str,
        pooling: Pooling = "last",
        chat_format: ChatFormat = ChatFormat(),
    ) -> None:
        self.bus = bus
        self.pipeline = pipeline
        self.model_name = model_name
        self.pooling = pooling  # the server's --embedding-pooling
        self.chat_format = chat_format  # what the model writes beside its answers: tool calls, thinking
        self.streams: dict[str, BusStream] = {}
        self._tasks: set[asyncio.Task] = set()

    async def on_request(
        self, request: PublicRequest, reply_to: str | None, tenant: str | None = None
    ) -> Aborted | Error | None:
        """`tenant`: with API keys, the last token of the subject it came on; None without them."""
        match request:
            case AbortGenerate():
                return await self._abort(request, tenant)
            case GenerateRequest():
                return await self._on_generate(request, reply_to, tenant)
            case EmbedRequest() | ScoreRequest():
                return self._on_prompt_only(request, reply_to, tenant)

    async def _abort(self, request: AbortGenerate, tenant: str | None) -> Aborted | Error:
        """Ends requests, keeping their output: with API keys only the subject's tenant's, and
        without them anyone's. A request aborts by id at the gateway that took it."""
        if (request.request_id is None) == (not request.abort_all):
            return Error("invalid_request", "give request_id or abort_all", param="request_id")
        owner = None if tenant is None else Tenant(tenant)
        if request.abort_all:
            aborted = await self.pipeline.abort_all(owner)
            return aborted if isinstance(aborted, Error) else Aborted(aborted)
        return Aborted(await self.pipeline.abort_request(request.request_id, owner))

    async def _on_generate(self, request: GenerateRequest, reply_to: str | None, tenant: str | None) -> Error | None:
        if reply_to is None:
            return None  # nobody to answer
        if request.model is not None and request.model != self.model_name:
            return Error("not_found", f"The model `{request.model}` does not exist.", param="model")
        known = self.streams.get(request.request_id) if request.request_id else None
        if known is not None and known.tenant != tenant:
            # Another tenant's request: neither its replies nor its id are this tenant's.
            return Error(
                "invalid_request", f"request_id {request.request_id!r} is taken; choose another", param="request_id"
            )
        if known is not None:
            await self._resume(known, request.resume_from, reply_to)
            return None
        if request.resume_from:
            return Error(
                "not_found",
                f"no request {request.request_id!r} to resume here; send it again from the start",
                param="request_id",
                retriable=True,
            )
        chat = chat_request(request, self.chat_format)
        if isinstance(chat, Error):
            return chat
        request, options = chat
        request_id = request.request_id or uuid.uuid4().hex
        stream = self.streams[request_id] = BusStream(reply_to, tenant=tenant)
        # Generation outlives this callback: the subscription must go on to the next request.
        task = asyncio.create_task(self._serve(request, request_id, stream, options))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    def _on_prompt_only(
        self, request: EmbedRequest | ScoreRequest, reply_to: str | None, tenant: str | None
    ) -> Error | None:
        """Embeds or scores in a task of its own, which replies once; the subscription goes on."""
        if reply_to is None:
            return None
        if request.model is not None and request.model != self.model_name:
            return Error("not_found", f"The model `{request.model}` does not exist.", param="model")
        task = asyncio.create_task(self._serve_prompt_only(request, reply_to, request_tenant(tenant, request.user)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    async def _serve_prompt_only(self, request: EmbedRequest | ScoreRequest, reply_to: str, tenant: Tenant) -> None:
        try:
            if isinstance(request, EmbedRequest):
                field = "texts" if request.texts is not None else "input_ids"
                reply = await embed(self.pipeline, request, tenant, self.pooling, field)
                if not isinstance(reply, Error):
                    reply = EmbedResult([vector.tolist() for vector in reply.vectors], reply.prompt_tokens)
            else:
                fields = (
                    "input_ids" if request.text is None else "text",
                    "output_ids" if request.output_texts is None else "output_texts",
                )
                reply = await score(self.pipeline, request, tenant, fields)
        except Exception as exc:  # one request's failure must not take the others down
            log.exception("bus_request_failed")
            reply = Error("internal", f"{type(exc).__name__}: {exc}", retriable=True)
        await self.bus.reply(reply_to, reply)

    async def _resume(self, stream: BusStream, resume_from: int, reply_to: str) -> None:
        log.info("bus_stream_resumed", resume_from=resume_from, sent=len(stream.chunks), finished=bool(stream.finals))
        stream.reply_to = reply_to
        for reply in stream.chunks[resume_from:] + stream.finals:
            await self.bus.reply(reply_to, reply)

    async def _serve(self, request: GenerateRequest, request_id: str, stream: BusStream, options: ReplyOptions) -> None:
        try:
            await self._generate(request, request_id, stream, options)
        except Exception as exc:  # one request's failure must not take the others down
            log.exception("bus_request_failed")
            await self._finish(stream, [Error("internal", f"{type(exc).__name__}: {exc}", retriable=True)])

    async def _generate(
        self, request: GenerateRequest, request_id: str, stream: BusStream, options: ReplyOptions
    ) -> None:
        """`options`: how the replies are read (chat_replies.py)."""
        group = await self.pipeline.submit(
            request, tenant=request_tenant(stream.tenant, request.user), request_id=request_id
        )
        if isinstance(group, Error):
            await self._finish(stream, [group])
            return
        try:
            token_ids: list[list[int]] = [[] for _ in group.choices]
            replies = [ChoiceReply(options.reader(group.prompt_ids)) for _ in group.choices]
            results: list[GenerateResult] = []
            async for index, output in group:
                if output.error:
                    await self._finish(stream, [output.error])
                    return
                token_ids[index] += output.token_ids
                parts = replies[index].add(output.text, final=output.finish_reason is not None)
                if request.stream and (output.token_ids or parts):
                    chunk = GenerateChunk(
                        request_id,
                        len(stream.chunks),
                        output.token_ids,
                        parts.text,
                        index,
                        output.logprobs,
                        output.weight_version,
                        parts.reasoning_content,
                        parts.tool_calls,
                    )
                    stream.chunks.append(chunk)
                    await self.bus.reply(stream.reply_to, chunk)
                if output.finish_reason:
                    results.append(self._result(request, group, index, output, token_ids[index], replies[index]))
            await self._finish(stream, sorted(results, key=lambda r: r.index))
        finally:
            await group.close()

    @staticmethod
    def _result(
        request: GenerateRequest,
        group: RequestGroup,
        index: int,
        end: RequestOutput,
        token_ids: list[int],
        reply: ChoiceReply,
    ) -> GenerateResult:
        """Choice `index`'s result, from its record: its tokens' logprobs all delivered, and the
        prompt's as the first choice computed them for every choice."""
        params, record = request.params, group.choices[index].record
        scored = params.prompt_logprobs_from is not None
        return GenerateResult(
            group.request_id,
            reply.text,
            token_ids,
            reply.finish_reason(end.finish_reason),
            len(group.prompt_ids),
            end.completion_tokens,
            group.cached_tokens,
            index,
            logprobs=record.logprobs.whole() if params.logprobs else None,
            prompt_logprobs=group.prompt_logprobs if scored else None,
            prompt_ids=group.prompt_ids if scored else [],
            matched_stop=end.matched_stop,
            created=record.created,
            weight_version=record.weight_version,
            version_spans=list(record.version_spans),
            reasoning_content=reply.reasoning_content,
            tool_calls=reply.tool_calls(),
        )

    async def _finish(self, stream: BusStream, finals: list[GenerateResult] | list[Error]) -> None:
        stream.finals, stream.finished_at = finals, time.monotonic()
        for reply in finals:
            await self.bus.reply(stream.reply_to, reply)

    async def forget_finished(self) -> None:
        """Drops the replies of requests that ended long enough ago for their clients to have them."""
        while True:
            await asyncio.sleep(FORGET_INTERVAL_S)
            horizon = time.monotonic() - KEEP_FINISHED_S
            for request_id in [
                r for r, s in self.streams.items() if s.finished_at is not None and s.finished_at < horizon
            ]:
                del self.streams[request_id]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
