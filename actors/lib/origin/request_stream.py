"""The origin's record of one request, and the stream of its outputs to the client.

The record (prompt ids, sampling parameters, and every token, character and logprob delivered so
far) is the one durable copy of the request: whatever dies downstream, the origin can resubmit from it,
and because outputs are numbered by their position, the client never receives a token twice.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec

from actors.lib.logprobs import LogprobsRun, slice_logprobs
from actors.lib.origin.request_figures import RequestClock
from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import SamplingParams, TokenLogprobs
from schemas.requests import RequestOutput, Tenant
from schemas.step import SequenceUpdate


@dataclass
class RequestRecord:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    tenant: Tenant = Tenant()
    delivered_ids: list[int] = field(default_factory=list)
    delivered_chars: int = 0
    cached_tokens: int = 0
    tokenizer_id: str = ""  # the tokenizer instance tracking the request
    migrations: int = 0
    fork_of: str | None = None  # the choice of the same prompt that computes it for this one
    client_request_id: str = ""  # the id its client knows: one for the n choices of a prompt
    created: float = field(default_factory=time.time)  # when the request was received, since the epoch
    # The logprobs delivered: of `delivered_ids` (a resubmitted run continues them), and of the
    # prompt, each position once however often a run recomputes it.
    logprobs: LogprobsRun = field(default_factory=LogprobsRun)
    prompt_logprobs: LogprobsRun = field(default_factory=LogprobsRun)
    matched_stop: int | str | None = None
    # [(first output index, version), ...]: the delivered tokens from each index on, up to the next
    # span's, were computed by that version's weights; a new span where an update changed them.
    version_spans: list[tuple[int, str]] = field(default_factory=list)
    end_version: str | None = None  # the version its end came with, for a request that drew nothing
    pooling: Pooling | None = None  # an embedding: it draws nothing, and its end brings `embedding`
    embedding: bytes | None = None  # the pooled vector, float32 little-endian [hidden], once it came

    @property
    def weight_version(self) -> str:
        """Of the weights that computed its last token (with none, those serving at its end)."""
        if self.version_spans:
            return self.version_spans[-1][1]
        return self.end_version or "default"

    def version_spans_of(self, tokens: int) -> list[tuple[int, str]]:
        """The spans of its first `tokens` delivered tokens, for a reader behind the record (a
        door that builds its reply from the outputs it has read); with no token, one span from 0
        of the version serving it."""
        spans = [span for span in self.version_spans if span[0] < tokens]
        return spans or [(0, self.weight_version)]

    def note_version(self, output: RequestOutput) -> None:
        """Books the version of `output`'s tokens, delivered from `output.output_index` on."""
        if output.token_ids and (not self.version_spans or self.version_spans[-1][1] != output.weight_version):
            self.version_spans.append((len(self.delivered_ids), output.weight_version))
        if output.finish_reason is not None:
            self.end_version = output.weight_version


class RequestStream:
    """Outputs of one accepted request, in order. Iterate until one carries a finish_reason."""

    def __init__(self, record: RequestRecord, timeout_s: float, on_close, clock: RequestClock | None = None) -> None:
        self.record = record
        self.clock = clock  # counts its times and tokens into the origin's figures (None: counted nowhere)
        self.finished = False  # the client has read the end, or left
        self.completed = False  # the end has come from upstream (the client may not have read it yet)
        self.ended = asyncio.Event()  # set once completed
        self.finish_reason: str | None = None  # the end's, once completed
        self.aborting = False  # its client aborted it and waits for its end: it must not run again
        self._early_end: RequestOutput | None = None  # an abort's end that came before tokens it follows
        self.progressed_at = time.monotonic()  # when the client last got something, or the request last moved
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._timeout_s = timeout_s
        self._on_close = on_close

    @property
    def request_id(self) -> str:
        return self.record.request_id

    @property
    def prompt_ids(self) -> list[int]:
        return self.record.prompt_ids

    @property
    def cached_tokens(self) -> int:
        return self.record.cached_tokens

    @property
    def running(self) -> bool:
        """Whether the request may still run downstream: its end has neither come nor been read."""
        return not (self.finished or self.completed)

    def deliver(self, output: RequestOutput) -> None:
        """Takes an output if it continues exactly where the client stands (or ends the request).
        An abort's end without tokens ends it where the client stands: one that comes before the
        tokens it follows (they take a tokenizer's detour) waits for them."""
        record = self.record
        if self.completed:
            return  # from a run resubmitted before the client read the end: it goes past the end
        delivered = len(record.delivered_ids)
        if output.error is None and output.output_index != delivered:
            if output.finish_reason != "abort" or output.token_ids:
                return  # a repeat from a run that was replaced, or another tokenizer's copy
            if output.output_index > delivered:
                self._early_end = output
                return
            output = msgspec.structs.replace(output, output_index=delivered, completion_tokens=delivered)
        prompt_logprobs = record.prompt_logprobs.extend(output.prompt_logprobs)
        if prompt_logprobs != output.prompt_logprobs:  # positions a recomputed prompt scored again
            output = msgspec.structs.replace(output, prompt_logprobs=prompt_logprobs)
        if not (output.token_ids or output.text or output.finish_reason or output.prompt_logprobs):
            return
        self.progressed_at = time.monotonic()
        record.note_version(output)
        record.delivered_ids += output.token_ids
        record.delivered_chars += len(output.text)
        record.logprobs.extend(output.logprobs)
        if output.cached_tokens is not None:
            record.cached_tokens = output.cached_tokens
        if self.clock is not None and output.token_ids:
            self.clock.tokens(len(output.token_ids), len(record.prompt_ids))
        if output.finish_reason is not None:
            self.completed, self.finish_reason, record.matched_stop = True, output.finish_reason, output.matched_stop
            if self.clock is not None:
                self.clock.end(output.finish_reason, len(record.prompt_ids), len(record.delivered_ids))
            self.ended.set()
        self._queue.put_nowait(output)
        early_end = self._early_end
        if early_end is not None and early_end.output_index == len(record.delivered_ids):
            self._early_end = None
            self.deliver(early_end)

    def deliver_step(self, update: SequenceUpdate, weight_version: str = "default") -> None:
        """Takes a step's update as the executor published it, for a request that wants no text (a
        tokenizer turns the others' steps into the outputs `deliver` takes): its tokens that
        continue where the client stands, with their logprobs; an end or prompt logprobs without
        tokens as they come. `weight_version`: the step's."""
        if self.completed:
            return
        if update.cached_tokens is not None:  # a run starts: how much of its prompt the cache served
            self.record.cached_tokens = update.cached_tokens
        if update.embedding is not None:  # with the end, which `deliver` takes next
            self.record.embedding = update.embedding
        start = len(self.record.delivered_ids)
        if update.token_ids and not update.continues(start):
            return
        skip = start - update.output_index if update.token_ids else 0
        token_ids = update.token_ids[skip:]
        finish = update.finish_reason
        self.deliver(
            RequestOutput(
                self.request_id,
                token_ids,
                "",
                finish,
                start + len(token_ids),
                output_index=start if token_ids else update.output_index,
                logprobs=slice_logprobs(update.logprobs, skip, len(update.token_ids)),
                prompt_logprobs=update.prompt_logprobs,
                matched_stop=token_ids[-1] if finish == "stop" and token_ids else None,
                weight_version=weight_version,
                error=update.error,
            )
        )

    def end_aborted(self) -> None:
        """Ends the aborted request where its client stands, if no end came from downstream."""
        delivered = len(self.record.delivered_ids)
        self.deliver(RequestOutput(self.request_id, [], "", "abort", delivered, output_index=delivered))

    def fail(self, error: Error) -> None:
        self._queue.put_nowait(RequestOutput(self.request_id, [], "", "error", error=error))

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        while not self.finished:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                output = await asyncio.wait_for(self._queue.get(), max(remaining, 0.0))
            except TimeoutError:
                output = RequestOutput(
                    self.request_id,
                    [],
                    "",
                    "error",
                    error=Error("timeout", f"the request took longer than {self._timeout_s:g} s", retriable=True),
                )
            if output.finish_reason:
                self.finished = True
            yield output

    async def close(self) -> None:
        """Ends the request; aborts it downstream if it has not finished."""
        if self.clock is not None and not self.completed:
            # No end came: its client left ("abort"), or read a failure or a timeout ("error").
            reason = "abort" if self.running else "error"
            self.clock.end(reason, len(self.record.prompt_ids), len(self.record.delivered_ids))
        await self._on_close(self)


class RequestGroup:
    """The n choices of one prompt, each its own request downstream; n is 1 for most requests.
    Iterate for (choice index, output) until every choice has ended; each output carries the
    logprobs of its tokens and the prompt's that came with it, the records all delivered."""

    def __init__(self, request_id: str, prompt_ids: list[int]) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.choices: list[RequestStream] = []

    @property
    def cached_tokens(self) -> int:
        return self.choices[0].cached_tokens  # the prompt's reuse, as the first choice found it

    @property
    def created(self) -> float:
        return self.choices[0].record.created

    @property
    def prompt_logprobs(self) -> TokenLogprobs | None:
        """Of the prompt, as the first choice computed it for all (the others fork it)."""
        return self.choices[0].record.prompt_logprobs.whole()

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        if len(self.choices) == 1:
            async for output in self.choices[0]:
                yield 0, output
            return
        merged: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()

        async def forward(index: int, stream: RequestStream) -> None:
            async for output in stream:
                merged.put_nowait((index, output))

        pumps = [asyncio.create_task(forward(i, s)) for i, s in enumerate(self.choices)]
        try:
            for _ in range(len(self.choices)):
                while True:
                    index, output = await merged.get()
                    yield index, output
                    if output.finish_reason:
                        break
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def close(self) -> None:
        for stream in self.choices:
            await stream.close()
