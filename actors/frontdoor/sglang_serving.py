"""Serving SGLang's native `/generate` and `/abort_request`: each item of a batch is a request of
its own through the origin, all run at once; the replies come as one JSON body (an object for one
prompt, a list for a batch) or as server-sent events that repeat everything so far, as SGLang's do
(with `--incremental-streaming-output`, as SGLang's then do, only what is new).

An abort keeps the output: the aborted requests answer with finish_reason "abort" and every token
they generated, with its logprobs. A client that leaves mid-request aborts its requests outright.
"""

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import msgspec
from aiohttp import web

from actors.frontdoor.choice_output import ChoiceOutput, LogprobRun
from actors.frontdoor.http_errors import error_response, overloaded
from actors.frontdoor.openai_responses import SSE_DONE, error_body, json_body, sse_event
from actors.frontdoor.request_fields import invalid
from actors.frontdoor.sglang_protocol import GenerateBatch, GenerateItem, parse_abort_request, parse_generate_request
from actors.frontdoor.sglang_responses import generate_reply
from actors.frontdoor.tenants import Tenants
from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.request_stream import RequestGroup
from schemas.errors import Error
from schemas.requests import RequestOutput, Tenant

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SGLANG_NAMES = {  # our fields, as SGLang's clients name them
    "prompt_logprobs_from": "logprob_start_len",
    "logprob_token_ids": "token_ids_logprob",
    "max_tokens": "sampling_params.max_new_tokens",
    "n": "sampling_params.n",
    "min_tokens": "sampling_params.min_new_tokens",
    "logit_bias": "sampling_params.logit_bias",
    "allowed_token_ids": "sampling_params.allowed_token_ids",
    "disallowed_token_ids": "sampling_params.disallowed_token_ids",
    "stop_token_ids": "sampling_params.stop_token_ids",
    "stop": "sampling_params.stop",
    "stop_regex": "sampling_params.stop_regex",
    "session_id": "session_params.id",
    "session_parent": "session_params.rid",
}


def sglang_name(param: str | None) -> str | None:
    """Our field (`stop_regex[1]` too) as SGLang's clients name it."""
    if param is None:
        return None
    head, rest = re.match(r"([^.\[]*)(.*)", param).groups()
    return SGLANG_NAMES.get(head, head) + rest


class _ItemOutput:
    """What one item's choices delivered so far; they share the prompt and its logprobs."""

    def __init__(self, item: GenerateItem, group: RequestGroup) -> None:
        self.item = item
        self.group = group
        self.choices = [ChoiceOutput(stream.record) for stream in group.choices]
        self.prompt_logprobs = LogprobRun()
        self.texts: dict[int, str] = {}
        self.sent = [(0, 0)] * len(self.choices)  # per choice, the tokens and characters streamed so far

    def add(self, index: int, output: RequestOutput) -> None:
        self.choices[index].add(output)
        self.prompt_logprobs.extend(output.prompt_logprobs)
        self.texts.update(output.token_texts)

    def reply(self, index: int, since: tuple[int, int] = (0, 0)) -> dict:
        """The choice's reply, of what came after `since` (tokens, characters) alone."""
        group, item = self.group, self.item
        return generate_reply(
            group.choices[index].request_id,
            self.choices[index],
            group.prompt_ids,
            self.prompt_logprobs,
            self.texts,
            group.cached_tokens,
            item.logprob,
            item.max_new_tokens,
            since,
        )

    def next_event(self, index: int, incremental: bool) -> dict:
        """The choice's next stream event: all so far, or when `incremental` what is new."""
        event = self.reply(index, self.sent[index] if incremental else (0, 0))
        choice = self.choices[index]
        self.sent[index] = (len(choice.token_ids), len(choice.text))
        return event


class SGLangServing:
    def __init__(
        self, pipeline: RequestPipeline, tenants: Tenants, max_concurrent: int, incremental: bool = False
    ) -> None:
        self.pipeline = pipeline
        self.tenants = tenants
        self.max_concurrent = max_concurrent
        self.incremental = incremental  # stream events carry only what is new
        self.running: set[str] = set()  # the rids of the /generate requests in flight here

    async def generate(self, request: web.Request) -> web.StreamResponse:
        batch = parse_generate_request(await request.read())
        if isinstance(batch, Error):
            return error_response(batch)
        if self.pipeline.in_flight >= self.max_concurrent:
            return overloaded(self.max_concurrent)
        if taken := next((item.rid for item in batch.items if item.rid in self.running), None):
            return error_response(invalid(f"rid {taken!r} is running; choose another", "rid"))
        tenant = self.tenants.request_tenant(request["identity"], "")
        rids = [item.rid for item in batch.items]
        self.running.update(rids)
        groups: list[RequestGroup] = []
        try:
            submitted = await self._submit_all(batch, tenant, groups)
            if isinstance(submitted, Error):
                return error_response(submitted)
            items = [_ItemOutput(item, group) for item, group in zip(batch.items, groups)]
            if batch.stream:
                return await self._stream(request, batch, items)
            return await self._whole(batch, items)
        finally:
            self.running.difference_update(rids)
            await asyncio.gather(*(group.close() for group in groups))

    async def _submit_all(self, batch: GenerateBatch, tenant: Tenant, groups: list[RequestGroup]) -> Error | None:
        """Submits every item at once; the groups that came are in `groups` (for the caller to
        close), whatever happens. The first refusal is the answer."""

        async def submit(item: GenerateItem) -> Error | None:
            group = await self.pipeline.submit(item.request, tenant=tenant, request_id=item.rid)
            if isinstance(group, Error):
                # The scheduler checks what needs the prompt's tokens or the model, in our names.
                return msgspec.structs.replace(group, param=sglang_name(group.param))
            groups.append(group)
            return None

        if len(batch.items) == 1:  # the usual case, submitted in this task: a gather would start a task first
            errors = [await submit(batch.items[0])]
        else:
            errors = await asyncio.gather(*(submit(item) for item in batch.items))
        groups.sort(key=lambda group: [item.rid for item in batch.items].index(group.request_id))
        return next((error for error in errors if error is not None), None)

    async def _whole(self, batch: GenerateBatch, items: list[_ItemOutput]) -> web.Response:
        async def collect(item: _ItemOutput) -> Error | None:
            async for index, output in item.group:
                if output.error:
                    return output.error
                item.add(index, output)
            return None

        errors = await asyncio.gather(*(collect(item) for item in items))
        if error := next((error for error in errors if error is not None), None):
            return error_response(error)
        replies = [item.reply(i) for item in items for i in range(len(item.choices))]
        return json_body(replies[0] if batch.single else replies)

    async def _stream(self, request: web.Request, batch: GenerateBatch, items: list[_ItemOutput]) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        async with contextlib.aclosing(_arrivals(items)) as arrivals:
            async for k, index, output in arrivals:
                if output.error:
                    await response.write(sse_event(error_body(output.error)))
                    break
                item = items[k]
                item.add(index, output)
                if output.token_ids or output.text or output.finish_reason:
                    event = item.next_event(index, self.incremental)
                    if not batch.single:
                        event["index"] = k * batch.choices + index
                    await response.write(sse_event(event))
        await response.write(SSE_DONE)
        await response.write_eof()
        return response

    async def abort_request(self, request: web.Request) -> web.Response:
        """SGLang's: `abort_all`, or the requests whose rid starts with `rid` ("" starts them all).
        Without API keys every request is the caller's; with them, its tenant's."""
        body = parse_abort_request(await request.read())
        if isinstance(body, Error):
            return error_response(body)
        rids = [body.rid] if isinstance(body.rid, str) or body.rid is None else body.rid
        key_tenant = request["identity"].tenant
        tenant = None if key_tenant is None else Tenant(key_tenant)
        if body.abort_all or any(not rid for rid in rids):
            aborted = await self.pipeline.abort_all(tenant)
            if isinstance(aborted, Error):
                return error_response(aborted)
            return web.Response(status=200)
        matching = [running for running in self.running if any(running.startswith(rid) for rid in rids)]
        await asyncio.gather(*(self.pipeline.abort_request(rid, tenant) for rid in matching))
        return web.Response(status=200)


async def _arrivals(items: list[_ItemOutput]) -> AsyncIterator[tuple[int, int, RequestOutput]]:
    """(item, choice, output) as the outputs arrive, until every choice has ended. One item (the
    usual request) is read directly: a task and a queue between would delay each output by a turn
    of the event loop, the first token's included."""
    if len(items) == 1:
        async for index, output in items[0].group:
            yield 0, index, output
        return
    arrived: asyncio.Queue[tuple[int, int, RequestOutput]] = asyncio.Queue()

    async def pump(k: int, item: _ItemOutput) -> None:
        async for index, output in item.group:
            arrived.put_nowait((k, index, output))

    pumps = [asyncio.create_task(pump(k, item)) for k, item in enumerate(items)]
    try:
        running = sum(len(item.choices) for item in items)
        while running:
            k, index, output = await arrived.get()
            yield k, index, output
            running -= bool(output.finish_reason)
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
