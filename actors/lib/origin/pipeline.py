"""The origin's I/O shell: the path of one request from its origin through the actors, and back as a
stream of outputs.

An origin (the HTTP frontdoor, or the gateway for bus clients) writes every request it takes into
its book (`RequestBook`), encodes the prompt with a tokenizer, asks one to track the output while
it submits to the scheduler (both at once: a round trip less before the first token), and receives
the text on its own subject. A request that wants no text skips the tokenizer: the origin takes
its tokens from the executor's step outputs. Leaving a stream before its end aborts the request,
which frees its KV blocks; a client that aborts and waits for the end (`abort_request`,
`abort_all`) gets every token generated so far (aborts.py). When an actor downstream dies, `MigrationPolicy` says which requests
move and `Migrations` moves them. The decisions live in those plain objects; this one subscribes,
asks, and hands each of them what arrives.
"""

import asyncio
import time
import uuid

import msgspec
import structlog

from actors.lib.origin.aborts import END_WAIT_S, Aborts
from actors.lib.origin.downstream import Downstream
from actors.lib.origin.held_requests import HeldRequests
from actors.lib.origin.intake import choice_records, refusal
from actors.lib.origin.migration_policy import MISSED_START, STALL_S, STALLED, MigrationPolicy
from actors.lib.origin.migrations import Migrations
from actors.lib.origin.request_book import RequestBook
from actors.lib.origin.request_figures import OriginFigures
from actors.lib.origin.request_stream import RequestGroup, RequestStream
from actors.lib.origin.session_turns import SessionTurnGroup, continue_conversation
from kernel.bus import Bus
from kernel.bus_subscriptions import BusUnavailable
from kernel.subjects import Subjects
from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import GenerateRequest
from schemas.health import Heartbeat
from schemas.metrics import ReadRequestFigures, RequestFigures
from schemas.requests import Accepted, OutputBatch, Tenant
from schemas.session import BeginTurn, RecordTurn
from schemas.step import StepOutput
from schemas.tokenizer import Encoded

log = structlog.get_logger()
LIVENESS_CHECK_S = 0.5
ORIGINS = ("frontdoor", "gateway")  # the actors whose processes are origins
PIPELINE_ACTORS = ("tokenizer", "scheduler", "executor")  # those every request passes through
# A request that comes while one of them is not ready (the server starting: an executor on a GPU
# loads and captures for tens of seconds; or one restarting) waits for it this long, then is
# refused with a retriable error naming what is not ready.
READY_WAIT_S = 60.0


class RequestPipeline:
    """Invariant: a request is in the book from before its Submit leaves until its client closes it,
    so each of its outputs finds it, and every migration sees it while it may run downstream."""

    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        origin_id: str,
        request_timeout_s: float,
        max_migrations: int,
        abort_end_wait_s: float = END_WAIT_S,
    ) -> None:
        self._bus = bus
        self._subjects = subjects
        self._origin_subject = subjects.origin(origin_id)
        self._request_timeout_s = request_timeout_s
        self._book = RequestBook()
        self.figures = OriginFigures(origin_id)
        self._policy = MigrationPolicy(max_migrations)
        self._downstream = Downstream(bus, subjects, self._origin_subject)
        self._migrations = Migrations(self._downstream, self._policy, retry_for_s=request_timeout_s)
        self._aborts = Aborts(self._downstream, abort_end_wait_s)
        self._steps_subscription = asyncio.Lock()
        self._receiving_steps = False
        self._held = HeldRequests()

    async def start(self) -> None:
        await self._bus.subscribe(self._origin_subject, OutputBatch, self._on_outputs)
        await self._bus.subscribe(self._subjects.all_heartbeats, Heartbeat, self._on_heartbeat)
        await self._bus.subscribe(self._subjects.metrics_origins, ReadRequestFigures, self._on_read_figures)
        self._bus.on_reconnect(self._after_bus_outage)

    @property
    def in_flight(self) -> int:
        """Requests taken and not yet closed by their clients (each choice of n counts), and those
        held until the actors on their path are ready: the concurrency limit counts both."""
        return len(self._book) + len(self._held)

    def not_ready(self, actors: tuple[str, ...]) -> dict[str, str]:
        """Of `actors`, those with no live instance that can serve now, each with why."""
        return self._policy.not_ready(actors)

    @property
    def live_origins(self) -> int:
        """The origin processes alive now (this one among them once its first heartbeat is back):
        how many answers a `ReadRequestFigures` on the bus can get."""
        return self._policy.live_instances(ORIGINS)

    async def _on_read_figures(self, _message: ReadRequestFigures, _reply_to: str | None) -> RequestFigures:
        return self.figures.snapshot(self.in_flight)

    async def encode(self, request: GenerateRequest, continuation: bool = False) -> Encoded | Error:
        """The prompt's tokens, as a request's would be; with `continuation`, without the special
        tokens that start a text (what a scored output's text is, after its input)."""
        return await self._downstream.encode(request, continuation)

    async def _on_outputs(self, batch: OutputBatch, _reply_to: str | None) -> None:
        self._book.deliver(batch)

    async def _on_steps(self, step: StepOutput, _reply_to: str | None) -> None:
        self._book.deliver_step(step)

    async def _receive_steps(self) -> Error | None:
        """Subscribes to the step outputs, once: from the first request that wants no text on, as
        an origin that has none would only decode every step to drop it."""
        async with self._steps_subscription:
            if not self._receiving_steps:
                try:
                    await self._bus.subscribe(self._subjects.step_outputs, StepOutput, self._on_steps)
                except BusUnavailable as exc:
                    return Error("unavailable", str(exc), retriable=True)
                self._receiving_steps = True
        return None

    # -- one request ----------------------------------------------------------------------

    async def submit(
        self,
        request: GenerateRequest,
        tenant: Tenant = Tenant(),
        request_id: str | None = None,
        pooling: Pooling | None = None,
    ) -> RequestGroup | Error:
        """Encodes and submits `request` (under `request_id`, or a new one), each of its n choices
        as a request of its own; the caller must `close()` the group it gets. With `pooling` it is
        an embedding (prompt_runs.py builds those)."""
        created, arrived = time.time(), time.monotonic()
        if error := refusal(request):
            return error
        if request.cache_salt:  # it narrows the tenant's cached prefixes to those of the same salt
            tenant = msgspec.structs.replace(tenant, cache_salt=request.cache_salt)
        # A request without text takes its tokens from the step outputs: nothing goes downstream
        # before they can arrive.
        if not request.params.detokenize and (error := await self._receive_steps()):
            return error
        request_id = request_id or uuid.uuid4().hex
        if self._path_not_ready():
            wait_s = min(READY_WAIT_S, self._request_timeout_s)
            if error := await self._held.hold(request_id, tenant, self._path_not_ready, wait_s):
                return error
        aborted = self._held.take_aborted(request_id)
        earlier = None
        if request.session is not None and not aborted:  # a turn aborted before it began leaves its session be
            begin = BeginTurn(request.session.session_id, tenant, request_id, request.session.parent_turn)
            earlier = await self._downstream.begin_turn(begin)
            if isinstance(earlier, Error):
                return earlier
        # A constraint is checked beside the encoding, so a bad schema or grammar is refused before
        # anything runs, at no added wait.
        encoded, checked = await asyncio.gather(
            self._downstream.encode(request, continuation=bool(earlier and earlier.token_ids)),
            self._downstream.check_constraint(request.params.constraint),
        )
        for reply in (checked, encoded):
            if isinstance(reply, Error):
                return reply
        if earlier is None:
            group = RequestGroup(request_id, encoded.token_ids)
        else:
            group = SessionTurnGroup(
                request_id,
                continue_conversation(earlier.token_ids, encoded),
                request.session,
                tenant,
                earlier.parent_turn,
                self._record_turn,
            )
        records = choice_records(request_id, group.prompt_ids, request.params, request.n, tenant, created, pooling)
        for record in records:
            stream = RequestStream(record, self._request_timeout_s, self.release, self.figures.clock(arrived))
            self._book.open(stream)
            group.choices.append(stream)
            if aborted:  # while it was held: never submitted
                stream.end_aborted()
                continue
            try:
                reply = await self._track_and_submit(stream)
            except asyncio.CancelledError:  # the client left: abort what was submitted
                await group.close()
                raise
            if isinstance(reply, Error):
                stream.clock.forget()  # refused: it never ran
                await group.close()
                return reply
        log.info("request_submitted", request_id=request_id, prompt_tokens=len(group.prompt_ids), choices=request.n)
        return group

    def _path_not_ready(self) -> dict[str, str]:
        return self._policy.not_ready(PIPELINE_ACTORS)

    async def _track_and_submit(self, stream: RequestStream) -> Accepted | Error:
        """Tracks and submits a new request at once. The Track leaves first (gather starts its tasks in
        order, and each publishes before it waits), and the step outputs follow from the Submit, so
        the tokenizer nearly always has the Track before them; when it had not, it says so, and the
        request is submitted again, with the tokenizer now tracking it. A request that wants no text
        is not tracked: the origin receives the step outputs itself."""
        record = stream.record
        if not record.params.detokenize:
            return await self._downstream.submit(record)
        tracked, accepted = await asyncio.gather(self._downstream.track(record), self._downstream.submit(record))
        for reply in (tracked, accepted):
            if isinstance(reply, Error):
                return reply  # the caller closes the request, which aborts and untracks it
        if tracked.missed_start:
            self._migrations.start(stream, MISSED_START)
        return accepted

    async def _record_turn(self, turn: RecordTurn) -> None:
        reply = await self._downstream.record_turn(turn)
        if isinstance(reply, Error):  # the session closed meanwhile, or went with a restarted scheduler
            log.warning("turn_not_recorded", request_id=turn.turn_id, session_id=turn.session_id, error=reply.message)

    async def release(self, stream: RequestStream) -> None:
        """Its client is done with the request: out of the book, and aborted downstream if it may
        still run there. A tokenizer that tracks it forgets it: an abort's end may have come from
        the scheduler or from the origin itself, not through the tokenizer."""
        self._book.close(stream.request_id)
        running = stream.running
        if running:
            stream.finished = True
            log.info("request_aborted", request_id=stream.request_id)
            await self._downstream.abort(stream.request_id)
        if stream.record.params.detokenize and (running or stream.finish_reason == "abort"):
            await self._downstream.untrack(stream.request_id)

    # -- aborts that keep the output --------------------------------------------------------

    async def abort_request(self, request_id: str, tenant: Tenant | None = None) -> list[str]:
        """Aborts the request its client knows as `request_id` (every one of its n choices), if
        `tenant` may (None: anyone may): each ends with finish_reason "abort", after every token
        it generated and their logprobs. Returns the ids aborted downstream (`<id>-<i>` for a
        choice of n); none if the request is not this origin's or has ended."""
        if self._held.abort(request_id, tenant):
            log.info("request_aborted_by_client", request_id=request_id, held=True)
            return [request_id]
        streams = self._book.of_client(request_id, tenant)
        if streams:
            log.info("request_aborted_by_client", request_id=request_id, choices=len(streams))
            await self._aborts.abort(streams)
        return [stream.request_id for stream in streams]

    async def abort_all(self, tenant: Tenant | None = None) -> list[str] | Error:
        """Aborts, as `abort_request` does, every request of `tenant` (narrowed by its `user` if it
        has one), or with None every request, whichever origin took it. Returns the ids aborted
        downstream."""
        held = self._held.abort_all(tenant)
        aborted = await self._aborts.abort_all(tenant, self._book.of_tenant(tenant))
        log.info("requests_aborted_by_client", tenant=tenant and tenant.name, aborted=aborted, held=held)
        return aborted if isinstance(aborted, Error) else held + aborted

    # -- migration ------------------------------------------------------------------------

    async def _after_bus_outage(self) -> None:
        self._migrations.start_all(self._book.running(), self._policy.on_bus_reconnected())

    async def _on_heartbeat(self, beat: Heartbeat, _reply_to: str | None) -> None:
        if migration := self._policy.on_heartbeat(beat):
            self._migrations.start_all(self._book.running(), migration)

    async def watch_liveness(self) -> None:
        """Migrates the requests that a dead scheduler or tokenizer leaves behind, and, for a while
        after a bus outage, those that stall."""
        while True:
            await asyncio.sleep(LIVENESS_CHECK_S)
            now = time.monotonic()
            if self._policy.watching_stalls(now):
                for stream in self._book.stalled(now, STALL_S):
                    self._migrations.start(stream, STALLED)
            for migration in self._policy.on_silence(now):
                self._migrations.start_all(self._book.running(), migration)

    async def close(self) -> None:
        await self._migrations.close()
        await self._aborts.close()
