"""The public bus API: `<ns>.generate` request/reply for other services.

A request with `stream` set gets `GenerateChunk`s at its reply inbox, in order, then a final
`GenerateResult`; otherwise just the result. Failures are `Error` replies.
"""

import asyncio

import structlog

from actors.frontdoor.pipeline import RequestPipeline
from kernel.bus import Bus
from schemas.errors import Error
from schemas.generate import GenerateChunk, GenerateRequest, GenerateResult

log = structlog.get_logger()


class BusApi:
    def __init__(self, bus: Bus, pipeline: RequestPipeline, model_name: str) -> None:
        self.bus = bus
        self.pipeline = pipeline
        self.model_name = model_name
        self._tasks: set[asyncio.Task] = set()

    async def on_generate(self, request: GenerateRequest, reply_to: str | None) -> Error | None:
        if reply_to is None:
            return None  # nobody to answer
        if request.model is not None and request.model != self.model_name:
            return Error("not_found", f"The model `{request.model}` does not exist.", param="model")
        # Generation outlives this callback: the subscription must go on to the next request.
        task = asyncio.create_task(self._serve(request, reply_to))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    async def _serve(self, request: GenerateRequest, reply_to: str) -> None:
        try:
            await self._generate(request, reply_to)
        except Exception as exc:  # one request's failure must not take the others down
            log.exception("bus_request_failed")
            await self.bus.reply(reply_to, Error("internal", f"{type(exc).__name__}: {exc}", retriable=True))

    async def _generate(self, request: GenerateRequest, reply_to: str) -> None:
        stream = await self.pipeline.submit(request, cache_namespace=request.user)
        if isinstance(stream, Error):
            await self.bus.reply(reply_to, stream)
            return
        try:
            token_ids: list[int] = []
            text: list[str] = []
            sequence = 0
            async for output in stream:
                if output.error:
                    await self.bus.reply(reply_to, output.error)
                    return
                token_ids += output.token_ids
                text.append(output.text)
                if request.stream and (output.token_ids or output.text):
                    await self.bus.reply(reply_to, GenerateChunk(stream.request_id, sequence, output.token_ids, output.text))
                    sequence += 1
                if output.finish_reason:
                    result = GenerateResult(
                        stream.request_id, "".join(text), token_ids, output.finish_reason,
                        len(stream.prompt_ids), output.completion_tokens, stream.cached_tokens,
                    )
                    await self.bus.reply(reply_to, result)
        finally:
            await stream.close()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
