"""The scheduler actor: owns the request table, the queue, the running batch, the KV block ids
and the sessions table.

It wraps a `ContinuousBatcher`, built for the executor epoch it follows (executor_epochs.py,
batcher_setup.py): submits, aborts and step outputs go in, executor commands come out, published as
one message per scheduling round without waiting for a reply. Beside it a `SessionTable` keeps the turns of open sessions and pins their KV in the batcher's prefix cache,
`DurableSessions` (durable_sessions.py) answers for it and keeps the snapshot actor's copy on disk
up to date, and a `SchedulerAdmin` (admin.py) answers the admin conversations and the commit of
new weights.
"""

import asyncio
import uuid

from actors.scheduler.admin import PauseChanged, SchedulerAdmin, admin_subjects
from actors.scheduler.batcher_setup import new_batcher, reset_batcher, session_budget_tokens
from actors.scheduler.batching import ContinuousBatcher
from actors.scheduler.disk_link import DiskLink
from actors.scheduler.durable_sessions import DurableSessions
from actors.scheduler.executor_epochs import ExecutorEpochs
from actors.scheduler.request_ends import ends_of_aborted
from actors.scheduler.sequence import Sequence
from actors.scheduler.sessions import SessionTable
from kernel.actor import Actor
from kernel.liveness import Liveness
from kernel.tenants import request_tenant
from schemas.admin import AdminReply, AdminRequest, FlushCache
from schemas.errors import Error
from schemas.health import Heartbeat
from schemas.requests import Abort, AbortAll, Aborted, Accepted, OutputBatch, SchedulerRequest, Submit, Tenant
from schemas.scheduler_weights import CacheGeneration, WeightsCommitted
from schemas.session import AsTenant, BeginTurn, PublicSessionRequest, RecordTurn, SessionReply, SessionRequest
from schemas.step import Command, Commands, ExecutorInfo, StepOutput

ORPHAN_CHECK_S = 0.5
SESSION_CHECK_S = 0.5  # how often idle sessions are looked for
ORIGIN_ACTORS = ("frontdoor", "gateway")  # the actors that keep request records: their death orphans requests


class SchedulerActor(Actor):
    """Admits requests, batches them continuously and hands out KV blocks."""

    name = "scheduler"
    on_request_path = True

    async def start(self) -> None:
        self.scheduler_id = uuid.uuid4().hex[:12]
        self._sending = asyncio.Lock()  # held while one round of commands goes out in parts
        self.batcher: ContinuousBatcher | None = None
        self.epochs = ExecutorEpochs(self.bus, self.subjects, self.spawn, self._follow_executor)
        self.sessions: SessionTable | None = None
        self.durable = DurableSessions(self.bus, self.subjects, self.log)
        self.admin: SchedulerAdmin | None = None  # the admin conversations, once an executor is known
        self.weight_version = "default"  # the executor's, for the ends of requests it never ran
        self.disk_link = DiskLink(
            self.bus, self.subjects, lambda: self.batcher and self.batcher.kv.disk, self.spawn, self._schedule, self.log
        )
        await self.bus.subscribe(self.subjects.executor_info, ExecutorInfo, self.epochs.heard)
        await self.bus.subscribe(self.subjects.step_outputs, StepOutput, self._on_step)
        await self.bus.subscribe(self.subjects.scheduler, SchedulerRequest | SessionRequest, self._on_request)
        await self.bus.subscribe(self.subjects.scheduler_weights, WeightsCommitted, self._on_weights_committed)
        if self.config.tenancy.api_keys is None:  # the network is trusted: `user` names the tenant
            await self.bus.subscribe(self.subjects.sessions, PublicSessionRequest, self._on_session)
        else:  # the tenant is the subject's last token, on which only that tenant may publish (kernel/bus_grants.py)
            await self.bus.subscribe_under(self.subjects.sessions, PublicSessionRequest, self._on_session)
        for subject, kind in admin_subjects(self.subjects):
            await self.bus.subscribe(subject, kind, self._on_admin)
        self.origins = Liveness()
        for actor in ORIGIN_ACTORS:
            await self.bus.subscribe(self.subjects.heartbeat(actor), Heartbeat, self._on_origin_heartbeat)
        await self.bus.subscribe(self.subjects.heartbeat("snapshot"), Heartbeat, self._on_snapshot_heartbeat)
        await self.bus.subscribe(self.subjects.heartbeat("cache_tier"), Heartbeat, self.disk_link.heard)
        self.spawn(self._abort_orphans(), "abort_orphans")
        self.spawn(self._expire_sessions(), "expire_sessions")
        self.spawn(self.epochs.find(), "find_executor")
        self.bus.on_reconnect(self._after_bus_outage)

    @property
    def ready(self) -> bool:
        return self.batcher is not None and self.durable.restored.is_set()

    async def _after_bus_outage(self) -> None:
        self.origins.forgive_silence()  # their beats were lost with the bus, not their processes
        if self.batcher is not None:
            self.spawn(self.epochs.find(resync=True), "resync_executor")
            self.spawn(self.durable.send_all(self.sessions), "resend_sessions")

    async def _follow_executor(self, info: ExecutorInfo, previous_id: str | None) -> None:
        """Rebuilds the books for a new executor epoch: its requests go back in the queue."""
        if self.batcher is None:
            self.batcher = new_batcher(info, self.config.engine, self.config.tenancy)
        else:
            self.log.warning(
                "executor_changed", old=previous_id, new=info.executor_id, requeued=len(self.batcher.sequences)
            )
            reset_batcher(self.batcher, info, self.config.engine)
        budget = session_budget_tokens(info, self.config.engine)
        if self.sessions is None:
            self.sessions = SessionTable(self.batcher.kv.cache, budget)
            self.admin = SchedulerAdmin(self.batcher, self.sessions, self.disk_link.flush, self.log)
            self.spawn(self.durable.restore(self.sessions), "restore_sessions")
        else:
            self.sessions.attach(self.batcher.kv.cache, budget)
        self.weight_version = info.weight_version
        self.log.info(
            "executor_found", executor=info.executor_id, blocks=info.num_blocks, max_model_len=info.max_model_len
        )
        # Announce ourselves even with nothing to run: the executor drops what an earlier scheduler started.
        await self._send(self.batcher.schedule())
        # The disk tier lists what it holds now, not at the first request: a listing has the cache_tier
        # pull the chains a server on another machine left in the shared bucket (cache_tier/actor.py).
        self.disk_link.send()

    async def _on_request(
        self, message: SchedulerRequest | SessionRequest, reply_to: str | None
    ) -> Accepted | Aborted | SessionReply | None:
        match message:
            case Submit(request_id, prompt_ids, params, origin, output_ids, tenant, fork_of, pooling):
                if self.batcher is None:
                    return Error("unavailable", "no executor is running yet", retriable=True)
                known = self.batcher.sequences.get(request_id)
                if known is not None and known.origin == origin:
                    self.batcher.abort(request_id)  # a resubmission whose Abort the bus lost
                error = self.batcher.submit(
                    request_id, prompt_ids, params, origin, output_ids, tenant, fork_of, pooling
                )
                if error:
                    return error
                await self._schedule()
                return Accepted(request_id)
            case Abort(request_id, reason, keep_output):
                seq = self.batcher.abort(request_id, keep_output) if self.batcher else None
                if seq is not None:
                    self.log.info("request_aborted", request_id=request_id, reason=reason)
                    await self._aborted([seq], keep_output)
                return Aborted([request_id] if seq else [])
            case AbortAll(tenant):
                aborted = self.batcher.abort_all(tenant) if self.batcher else []
                self.log.info("requests_aborted", count=len(aborted), tenant=tenant and tenant.name)
                await self._aborted(aborted, keep_output=True)
                return Aborted([seq.request_id for seq in aborted])
            case AsTenant(tenant, request):  # an HTTP client's, with the tenant of its key
                return await self._session(request, tenant)
            case BeginTurn() | RecordTurn():
                return await self._session(message, message.tenant)

    async def _aborted(self, aborted: list[Sequence], keep_output: bool) -> None:
        """After aborts: with `keep_output`, ends those that were not on the executor (whose end
        comes from there) for their origins, after the tokens they drew; then schedules."""
        for seq in aborted:
            self.sessions.turn_released(seq.request_id)
        ends = ends_of_aborted(aborted, self.weight_version) if keep_output else {}
        for origin, outputs in ends.items():
            await self.bus.publish(origin, OutputBatch(outputs))
        if aborted:
            await self._schedule()

    async def _on_session(
        self, message: PublicSessionRequest, _reply_to: str | None, key_tenant: str | None = None
    ) -> SessionReply:
        """A client's, on the public subject. `key_tenant`: with API keys, the subject's last token,
        which `user` only narrows; without them `user` names the tenant."""
        return await self._session(message, request_tenant(key_tenant, message.user))

    async def _session(self, message: PublicSessionRequest | BeginTurn | RecordTurn, tenant: Tenant) -> SessionReply:
        if self.sessions is None:
            return Error("unavailable", "no executor is running yet", retriable=True)
        return await self.durable.answer(self.sessions, message, tenant)

    async def _on_origin_heartbeat(self, beat: Heartbeat, _reply_to: str | None) -> None:
        self.origins.observe(beat)

    async def _on_snapshot_heartbeat(self, beat: Heartbeat, _reply_to: str | None) -> None:
        if self.sessions is not None:
            await self.durable.snapshot_heard(self.sessions, beat)

    async def _abort_orphans(self) -> None:
        """A dead origin's clients are gone with it: free what their requests hold."""
        while True:
            await asyncio.sleep(ORPHAN_CHECK_S)
            for dead in self.origins.expire():
                origin = self.subjects.origin(dead.instance_id)
                orphans = [
                    s.request_id
                    for s in (self.batcher.sequences.values() if self.batcher else [])
                    if s.origin == origin
                ]
                for request_id in orphans:
                    self.batcher.abort(request_id)
                if orphans:
                    self.log.warning("orphans_aborted", origin=origin, count=len(orphans))
                    await self._schedule()

    async def _expire_sessions(self) -> None:
        """A session unused for longer than its idle timeout closes itself, and its pins go."""
        while True:
            await asyncio.sleep(SESSION_CHECK_S)
            if self.sessions is not None:
                for session_id in self.sessions.expire(lambda turn_id: turn_id in self.batcher.sequences):
                    self.log.info("session_expired", session_id=session_id)
                await self.durable.send_changes(self.sessions)

    async def _on_admin(self, message: AdminRequest, _reply_to: str | None) -> AdminReply | Error:
        if self.admin is None:
            return Error("unavailable", "no executor is running yet", retriable=True)
        if isinstance(message, FlushCache):
            return await self.admin.flush(message.tier)
        match self.admin.answer(message):
            case PauseChanged(aborted):
                await self._aborted(aborted, keep_output=True)
                await self._schedule()
                return self.admin.pause_state()
            case reply:
                return reply

    async def _on_weights_committed(self, message: WeightsCommitted, _reply_to: str | None) -> CacheGeneration | Error:
        if self.admin is None:
            return Error("unavailable", "no executor is running yet", retriable=True)
        self.weight_version = message.version
        return self.admin.weights_committed(message)

    async def _on_step(self, output: StepOutput, _reply_to: str | None) -> None:
        if self.batcher is None:
            return
        if not self.epochs.follows(output.executor_id):
            return
        # The host slots an output reports moved are those of the scheduler whose commands the
        # executor ran: before it has seen ours, another's, which must not settle our slots.
        for seq in self.batcher.on_step(output, own_moves=output.scheduler_id == self.scheduler_id):
            self.sessions.turn_released(seq.request_id)
        if (failed := output.out_of_memory) is not None:
            self.log.warning(
                "executor_out_of_memory",
                sequences=failed.sequences,
                tokens=failed.tokens,
                running_limit=self.batcher.running_limit.limit,
                message=failed.message,
            )
        await self._schedule()

    async def _schedule(self) -> None:
        commands = self.batcher.schedule()
        # Nothing runs, yet a request waits: blocks are short, and session pins may hold the ones it needs.
        while (
            self.batcher.admitting
            and self.batcher.requests.waiting
            and not self.batcher.requests.running
            and self.sessions.unpin_oldest()
        ):
            commands += self.batcher.schedule()
        if commands:
            await self._send(commands)
        self.disk_link.send()

    async def _send(self, commands: list[Command]) -> None:
        """Publishes `commands` to the executor. A round over the bus's payload limit (one can carry
        three budgets of prompt tokens: NATS's default 1 MB at budgets near 70K tokens) goes in
        several messages, and the lock keeps another round from slipping in between them; the
        executor applies the commands in order, whatever steps it plans between the messages."""
        async with self._sending:
            # One command always fits: none is larger than the Submit it came of.
            messages = await self.bus.publish_in_parts(
                self.subjects.executor_commands, commands, lambda part, _last: Commands(self.scheduler_id, part)
            )
        if messages > 1:
            self.log.info("commands_split", commands=len(commands), messages=messages)
