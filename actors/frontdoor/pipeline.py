"""The path of one request from its origin through the actors, and back as a stream of outputs.

The frontdoor is the origin of every request it takes, over HTTP or the bus: it encodes the prompt
with a tokenizer, asks one to track the output, submits to the scheduler, and receives the text on
its own subject. Leaving a stream before its end aborts the request, which frees its KV blocks.
"""

import asyncio
import random
import uuid
from collections.abc import AsyncIterator

import msgspec
import structlog

from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams
from schemas.requests import Abort, Accepted, OutputBatch, RequestOutput, Submit
from schemas.tokenizer import Encode, Encoded, Track, Tracked, Untrack

log = structlog.get_logger()
CONTROL_TIMEOUT_S = 10.0  # encode, track and submit are quick; a slower answer means an actor is down


def check_params(params: SamplingParams) -> Error | None:
    """Range checks shared by HTTP and bus requests; the types are checked when decoding."""
    if params.max_tokens is not None and params.max_tokens <= 0:
        return Error("invalid_request", "max_tokens must be at least 1", param="max_tokens")
    if not 0.0 <= params.temperature <= 2.0:
        return Error("invalid_request", "temperature must be between 0 and 2", param="temperature")
    if not 0.0 < params.top_p <= 1.0:
        return Error("invalid_request", "top_p must be in (0, 1]", param="top_p")
    if params.top_k < -1:
        return Error("invalid_request", "top_k must be -1, 0 (off) or a positive number", param="top_k")
    if any(t < 0 for t in params.stop_token_ids):
        return Error("invalid_request", "stop_token_ids must not be negative", param="stop_token_ids")
    return None


class RequestStream:
    """The outputs of one accepted request. Iterate until an output carries a finish_reason."""

    def __init__(self, pipeline: "RequestPipeline", request_id: str, prompt_ids: list[int], timeout_s: float) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.finished = False
        self._pipeline = pipeline
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._timeout_s = timeout_s

    def deliver(self, output: RequestOutput) -> None:
        self._queue.put_nowait(output)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        while not self.finished:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                output = await asyncio.wait_for(self._queue.get(), max(remaining, 0.0))
            except TimeoutError:
                output = RequestOutput(self.request_id, [], "", "error", error=Error(
                    "timeout", f"the request took longer than {self._timeout_s:g} s", retriable=True))
            if output.finish_reason:
                self.finished = True
            yield output

    async def close(self) -> None:
        """Ends the request; aborts it downstream if it has not finished."""
        await self._pipeline.release(self)


class RequestPipeline:
    def __init__(self, bus: Bus, subjects: Subjects, origin_id: str, request_timeout_s: float) -> None:
        self.bus = bus
        self.subjects = subjects
        self.origin = subjects.origin(origin_id)
        self.request_timeout_s = request_timeout_s
        self.streams: dict[str, RequestStream] = {}

    async def start(self) -> None:
        await self.bus.subscribe(self.origin, OutputBatch, self._on_outputs)

    async def _on_outputs(self, batch: OutputBatch, _reply_to: str | None) -> None:
        for output in batch.outputs:
            stream = self.streams.get(output.request_id)
            if stream is not None:
                stream.deliver(output)

    async def encode(self, request: GenerateRequest) -> list[int] | Error:
        if request.input_ids is not None:
            return list(request.input_ids)
        encode = Encode(text=request.text, messages=request.messages)
        reply = await self.bus.request(self.subjects.tokenizer, encode, Encoded, CONTROL_TIMEOUT_S)
        return reply.token_ids if isinstance(reply, Encoded) else reply

    async def submit(self, request: GenerateRequest) -> RequestStream | Error:
        """Encodes and submits `request`; the caller must `close()` the stream it gets."""
        prompts = [p for p in (request.text, request.input_ids, request.messages) if p is not None]
        if len(prompts) != 1:
            return Error("invalid_request", "give exactly one of text, input_ids and messages", param="prompt")
        error = check_params(request.params)
        if error:
            return error
        prompt_ids = await self.encode(request)
        if isinstance(prompt_ids, Error):
            return prompt_ids
        params = request.params
        if params.seed is None:  # a seed of our own keeps the draw reproducible after a restart
            params = msgspec.structs.replace(params, seed=random.getrandbits(63))
        request_id = uuid.uuid4().hex
        stream = self.streams[request_id] = RequestStream(self, request_id, prompt_ids, self.request_timeout_s)
        track = Track(request_id, self.origin, params.stop, params.skip_special_tokens)
        reply = await self.bus.request(self.subjects.tokenizer, track, Tracked, CONTROL_TIMEOUT_S)
        if isinstance(reply, Tracked):
            submit = Submit(request_id, prompt_ids, params, self.origin)
            reply = await self.bus.request(self.subjects.scheduler, submit, Accepted, CONTROL_TIMEOUT_S)
        if isinstance(reply, Error):
            await self.release(stream)
            return reply
        log.info("request_submitted", request_id=request_id, prompt_tokens=len(prompt_ids))
        return stream

    async def release(self, stream: RequestStream) -> None:
        self.streams.pop(stream.request_id, None)
        if not stream.finished:
            stream.finished = True
            log.info("request_aborted", request_id=stream.request_id)
            await self.bus.publish(self.subjects.scheduler, Abort(stream.request_id))
            await self.bus.publish(self.subjects.tokenizer_untrack, Untrack(stream.request_id))
