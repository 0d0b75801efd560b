"""The path of one request from its origin through the actors, and back as a stream of outputs.

An origin (the HTTP frontdoor, or the gateway for bus clients) keeps the record of every request it
takes: it encodes the prompt with a tokenizer, asks one to track the output while it submits to the
scheduler (both at once: a round trip less before the first token), and receives the text on its
own subject. A request that wants no text skips the tokenizer: the origin takes its tokens from
the executor's step outputs. Leaving a stream before its end aborts the request, which frees its KV
blocks.
When the scheduler dies, the origin resubmits each running request as prompt + delivered tokens
under the same id; when a tokenizer dies, it tracks the requests that tokenizer tracked anew and
resubmits them.
A turn of a session is a request whose prompt starts with the tokens of an earlier turn, which the
scheduler keeps: the origin asks for them first, so that its record still holds the whole prompt,
and tells the scheduler the turn's tokens when it has finished, before its client sees the end.
"""

import asyncio
import functools
import random
import time
import uuid
from collections.abc import AsyncIterator

import msgspec
import structlog

from actors.lib.origin.request_stream import RequestGroup, RequestRecord, RequestStream
from kernel.bus import Bus, BusUnavailable
from kernel.liveness import Liveness
from kernel.randomness import choice_seed
from kernel.subjects import Subjects
from schemas.errors import Error
from schemas.generate import GenerateRequest
from schemas.health import Heartbeat
from schemas.requests import Abort, Accepted, OutputBatch, RequestOutput, Submit
from schemas.session import BeginTurn, RecordTurn, TurnRecorded, TurnTokens
from schemas.step import StepOutput
from schemas.tokenizer import Encode, Encoded, Track, Tracked, Untrack

log = structlog.get_logger()
CONTROL_TIMEOUT_S = 10.0  # encode, track and submit are quick; a slower answer means an actor is down
RETRY_INTERVAL_S = 0.25
LIVENESS_CHECK_S = 0.5
# After a bus outage, a request that gets nothing for STALL_S is migrated again, for STALL_WATCH_S.
STALL_S = 5.0
STALL_WATCH_S = 60.0


def continue_conversation(earlier_ids: list[int], encoded: Encoded) -> list[int]:
    """`encoded` appended to the tokens of an earlier turn, leaving out the leading tokens that close
    the earlier reply where it already ends with them (it stopped at its end-of-turn token)."""
    new_ids = encoded.token_ids
    for overlap in range(min(encoded.closing_tokens, len(earlier_ids)), 0, -1):
        if earlier_ids[-overlap:] == new_ids[:overlap]:
            return earlier_ids + new_ids[overlap:]
    return earlier_ids + new_ids


class SessionTurnGroup(RequestGroup):
    """A request that is a turn of a session: when it finishes, `record` tells the scheduler, before
    the client sees the end, so that the client's next turn can follow it."""

    def __init__(self, request_id: str, prompt_ids: list[int], record) -> None:
        super().__init__(request_id, prompt_ids)
        self._record = record

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        async for index, output in super().__aiter__():
            if output.finish_reason and output.error is None:
                await self._record(self.choices[index])
            yield index, output


class RequestPipeline:
    def __init__(self, bus: Bus, subjects: Subjects, origin_id: str, request_timeout_s: float, max_migrations: int) -> None:
        self.bus = bus
        self.subjects = subjects
        self.origin = subjects.origin(origin_id)
        self.request_timeout_s = request_timeout_s
        self.max_migrations = max_migrations
        self.streams: dict[str, RequestStream] = {}
        self.liveness = Liveness()
        self._migrations: set[asyncio.Task] = set()
        self._watch_stalls_until = 0.0  # monotonic time
        self._steps_subscription = asyncio.Lock()
        self._receiving_steps = False

    async def start(self) -> None:
        await self.bus.subscribe(self.origin, OutputBatch, self._on_outputs)
        await self.bus.subscribe(self.subjects.all_heartbeats, Heartbeat, self._on_heartbeat)
        self.bus.on_reconnect(self._after_bus_outage)

    async def _on_outputs(self, batch: OutputBatch, _reply_to: str | None) -> None:
        for output in batch.outputs:
            stream = self.streams.get(output.request_id)
            if stream is not None:
                stream.deliver(output)

    async def _receive_steps(self) -> Error | None:
        """Subscribes to the step outputs, once: from the first request that wants no text on, as
        an origin that has none would only decode every step to drop it."""
        async with self._steps_subscription:
            if not self._receiving_steps:
                try:
                    await self.bus.subscribe(self.subjects.step_outputs, StepOutput, self._on_steps)
                except BusUnavailable as exc:
                    return Error("unavailable", str(exc), retriable=True)
                self._receiving_steps = True
        return None

    async def _on_steps(self, step: StepOutput, _reply_to: str | None) -> None:
        for update in step.updates:
            stream = self.streams.get(update.request_id)
            if stream is not None and not stream.record.params.detokenize:
                stream.deliver_step(update)

    # -- one request ----------------------------------------------------------------------

    async def encode(self, request: GenerateRequest, continuation: bool = False) -> Encoded | Error:
        """The prompt's tokens; with `continuation`, as the next turns of a conversation (no BOS)."""
        if request.input_ids is not None:
            return Encoded(list(request.input_ids))
        encode = Encode(text=request.text, messages=request.messages, add_special_tokens=not continuation,
                        continuation=continuation)
        return await self.bus.request(self.subjects.tokenizer, encode, Encoded, CONTROL_TIMEOUT_S)

    async def submit(
        self, request: GenerateRequest, cache_namespace: str = "", request_id: str | None = None
    ) -> RequestGroup | Error:
        """Encodes and submits `request` (under `request_id`, or a new one), each of its n choices
        as a request of its own; the caller must `close()` the group it gets."""
        prompts = [p for p in (request.text, request.input_ids, request.messages) if p is not None]
        if len(prompts) != 1:
            return Error("invalid_request", "give exactly one of text, input_ids and messages", param="prompt")
        # The ranges were checked when the request was decoded (schemas/generate.py); what is left
        # here spans several fields.
        if request.params.stop and not request.params.detokenize:
            return Error("invalid_request", "stop strings match text: they need detokenize", param="stop")
        if request.session is not None and request.n > 1:
            return Error("invalid_request", "a turn of a session has one choice: n must be 1", param="n")
        request_id = request_id or uuid.uuid4().hex
        earlier = None
        if request.session is not None:
            begin = BeginTurn(request.session.session_id, cache_namespace, request_id, request.session.parent_turn)
            earlier = await self.bus.request(self.subjects.scheduler, begin, TurnTokens, CONTROL_TIMEOUT_S)
            if isinstance(earlier, Error):
                return earlier
        encoded = await self.encode(request, continuation=bool(earlier and earlier.token_ids))
        if isinstance(encoded, Error):
            return encoded
        prompt_ids = continue_conversation(earlier.token_ids, encoded) if earlier else encoded.token_ids
        params = request.params
        if params.seed is None:  # a seed of our own keeps the draw reproducible after a restart
            params = msgspec.structs.replace(params, seed=random.getrandbits(63))
        if earlier is None:
            group = RequestGroup(request_id, prompt_ids)
        else:
            record_turn = functools.partial(self._record_turn, request, cache_namespace, earlier.parent_turn)
            group = SessionTurnGroup(request_id, prompt_ids, record_turn)
        for index in range(request.n):
            # The first choice computes the prompt; the others fork it, each with its own seed.
            record = RequestRecord(
                group.request_id if request.n == 1 else f"{group.request_id}-{index}", prompt_ids,
                msgspec.structs.replace(params, seed=choice_seed(params.seed, index)), cache_namespace,
                fork_of=group.choices[0].request_id if index else None,
            )
            stream = self.streams[record.request_id] = RequestStream(record, self.request_timeout_s, self.release)
            group.choices.append(stream)
            try:
                reply = await self._track_and_submit(stream)
            except asyncio.CancelledError:  # the client left: abort what was submitted
                await group.close()
                raise
            if isinstance(reply, Error):
                await group.close()
                return reply
        log.info("request_submitted", request_id=group.request_id, prompt_tokens=len(prompt_ids), choices=request.n)
        return group

    async def _record_turn(
        self, request: GenerateRequest, user: str, parent_turn: str | None, stream: RequestStream
    ) -> None:
        """The turn's tokens are what its client got: up to a stop string, not what ran past it."""
        record = stream.record
        message = RecordTurn(request.session.session_id, user, record.request_id, parent_turn, request.session.replace,
                             record.prompt_ids + record.delivered_ids)
        reply = await self.bus.request(self.subjects.scheduler, message, TurnRecorded, CONTROL_TIMEOUT_S)
        if isinstance(reply, Error):  # the session closed meanwhile, or went with a restarted scheduler
            log.warning("turn_not_recorded", request_id=record.request_id, session_id=message.session_id,
                        error=reply.message)

    async def _track_and_submit(self, stream: RequestStream) -> Accepted | Error:
        """Tracks and submits a new request at once. The Track leaves first (gather starts its tasks in
        order, and each publishes before it waits), and the step outputs follow from the Submit, so
        the tokenizer nearly always has the Track before them; when it had not, it says so, and the
        request is submitted again, with the tokenizer now tracking it. A request that wants no text
        is not tracked: the origin already receives the step outputs when it is submitted."""
        record = stream.record
        if not record.params.detokenize:
            if error := await self._receive_steps():
                return error
            return await self._submit(record)
        tracked, accepted = await asyncio.gather(self._track(record), self._submit(record))
        for reply in (tracked, accepted):
            if isinstance(reply, Error):
                return reply  # the caller closes the request, which aborts and untracks it
        if tracked.missed_start:
            self._start_migration(stream, retrack=False, reason="its first outputs overtook the track")
        return accepted

    async def _track(self, record: RequestRecord) -> Tracked | Error:
        params = record.params
        track = Track(record.request_id, self.origin, params.stop, params.skip_special_tokens,
                      record.delivered_ids, record.delivered_chars)
        reply = await self.bus.request(self.subjects.tokenizer, track, Tracked, CONTROL_TIMEOUT_S)
        if isinstance(reply, Tracked):
            record.tokenizer_id = reply.instance_id
        return reply

    async def _submit(self, record: RequestRecord) -> Accepted | Error:
        """Submits the request as its record stands: the prompt, and the tokens its client has."""
        submit = Submit(record.request_id, record.prompt_ids, record.params, self.origin,
                        list(record.delivered_ids), record.cache_namespace, record.fork_of)
        return await self.bus.request(self.subjects.scheduler, submit, Accepted, CONTROL_TIMEOUT_S)

    async def release(self, stream: RequestStream) -> None:
        self.streams.pop(stream.request_id, None)
        if stream.running:
            stream.finished = True
            log.info("request_aborted", request_id=stream.request_id)
            await self.bus.publish(self.subjects.scheduler, Abort(stream.request_id))
            if stream.record.params.detokenize:
                await self.bus.publish(self.subjects.tokenizer_untrack, Untrack(stream.request_id))

    # -- migration ------------------------------------------------------------------------

    async def _after_bus_outage(self) -> None:
        """Outputs, tracks or submits may have been lost while the bus was down: every running
        request is submitted again from what its client has (and tracked again if it wants text)."""
        self.liveness.forgive_silence()
        self._watch_stalls_until = time.monotonic() + STALL_WATCH_S
        self._migrate_all(lambda record: True, retrack=True, reason="bus reconnected")

    async def _on_heartbeat(self, beat: Heartbeat, _reply_to: str | None) -> None:
        first = self.liveness.observe(beat)
        if first and beat.actor == "scheduler":
            # There is one scheduler: a new one means the old one is gone, whatever its heartbeats say.
            replaced = [i for i in self.liveness.instances.values() if i.actor == "scheduler" and i.instance_id != beat.instance_id]
            for instance in replaced:
                del self.liveness.instances[instance.instance_id]
            if replaced:
                self._migrate_all(lambda record: True, retrack=False, reason="scheduler restarted")

    async def watch_liveness(self) -> None:
        """Migrates the requests that a dead scheduler or tokenizer leaves behind, and, for a while
        after a bus outage, those that stall: a resync that lost a message must not hang a request."""
        while True:
            await asyncio.sleep(LIVENESS_CHECK_S)
            now = time.monotonic()
            if now < self._watch_stalls_until:
                stalled = [s for s in self.streams.values() if s.running and now - s.progressed_at > STALL_S]
                for stream in stalled:
                    stream.progressed_at = now
                    self._start_migration(stream, retrack=True, reason="stalled after a bus outage")
            for dead in self.liveness.expire():
                log.warning("actor_lost", actor=dead.actor, instance=dead.instance_id)
                if dead.actor == "scheduler":
                    self._migrate_all(lambda record: True, retrack=False, reason="scheduler lost")
                elif dead.actor == "tokenizer":
                    self._migrate_all(lambda record, gone=dead.instance_id: record.tokenizer_id == gone,
                                      retrack=True, reason="tokenizer lost")

    def _migrate_all(self, affected, retrack: bool, reason: str) -> None:
        """Migrates the running requests whose record `affected` picks."""
        for stream in list(self.streams.values()):
            if stream.running and affected(stream.record):
                self._start_migration(stream, retrack, reason)

    def _start_migration(self, stream: RequestStream, retrack: bool, reason: str) -> None:
        task = asyncio.create_task(self._migrate(stream, retrack, reason))
        self._migrations.add(task)
        task.add_done_callback(self._migrations.discard)

    async def _migrate(self, stream: RequestStream, retrack: bool, reason: str) -> None:
        record = stream.record
        record.migrations += 1
        if record.migrations > self.max_migrations:
            stream.fail(Error("unavailable", f"the request was migrated {self.max_migrations} times; retry it", retriable=True))
            return
        log.info("request_migrating", request_id=record.request_id, reason=reason, delivered=len(record.delivered_ids))
        if retrack and record.params.detokenize:
            reply = await self._retry(lambda: self._track(record))
            if isinstance(reply, Error):
                stream.fail(reply)
                return
        if not stream.running:
            return  # its end came meanwhile: nothing left to compute
        await self.bus.publish(self.subjects.scheduler, Abort(record.request_id, reason="migrate"))
        reply = await self._retry(lambda: self._submit(record))
        if isinstance(reply, Error):
            stream.fail(reply)
        elif not stream.running:  # the old run's end came while this one was submitted: stop this one
            await self.bus.publish(self.subjects.scheduler, Abort(record.request_id, reason="ended"))

    async def _retry(self, attempt):
        """Repeats `attempt` while it fails with a retriable error, up to the request timeout."""
        deadline = asyncio.get_running_loop().time() + self.request_timeout_s
        while True:
            reply = await attempt()
            if not (isinstance(reply, Error) and reply.retriable) or asyncio.get_running_loop().time() > deadline:
                return reply
            await asyncio.sleep(RETRY_INTERVAL_S)

    async def close(self) -> None:
        for task in self._migrations:
            task.cancel()
        await asyncio.gather(*self._migrations, return_exceptions=True)
