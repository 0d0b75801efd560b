"""The scheduler actor's line to the cache_tier actor: sends what the disk tier's books ask
(disk_tier.py), hands each answer back, lets a request stop waiting for its fetch at the deadline,
and notices a restarted cache_tier by its heartbeat. Every answer is followed by a scheduling
round, so a request whose fetch ended is admitted. An admin's flush of the disk tier goes the same
way, after the requests sent before it."""

import asyncio
from collections.abc import Awaitable, Callable, Coroutine

from actors.scheduler.disk_tier import ANSWER_TIMEOUT_S, FETCH_DEADLINE_S, DiskTier
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.cache import CacheTierReply, CacheTierRequest, DiskFlushed, FlushDisk
from schemas.errors import Error
from schemas.health import Heartbeat


class DiskLink:
    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        disk: Callable[[], DiskTier | None],
        spawn: Callable[[Coroutine, str], asyncio.Task],
        schedule: Callable[[], Awaitable[None]],
        log,
    ) -> None:
        self.bus, self.subjects = bus, subjects
        self.disk = disk  # the batcher's, now: a new executor brings new books
        self.spawn, self.schedule, self.log = spawn, schedule, log
        self.instance_id: str | None = None  # the cache_tier's, as last heard

    def send(self) -> None:
        """Sends the requests the disk tier's books have made since the last call."""
        if (disk := self.disk()) is None:
            return
        waiting = set()
        for request_id, request in disk.take_requests():
            self.spawn(self._ask(request_id, request), "disk_tier_request")
            if request_id is not None and request_id not in waiting:  # one deadline for a fetch's pieces
                waiting.add(request_id)
                self.spawn(self._deadline(request_id), "disk_tier_deadline")

    async def flush(self) -> int | Error:
        """Has the disk tier delete every block file; returns the blocks it forgot."""
        reply = await self.bus.request(self.subjects.cache_tier, FlushDisk(), CacheTierReply, ANSWER_TIMEOUT_S)
        if isinstance(reply, Error):
            return reply
        if not isinstance(reply, DiskFlushed):
            return Error("internal", f"the disk tier answered a flush with {type(reply).__name__}")
        if (disk := self.disk()) is not None:
            disk.flushed()
        return reply.blocks

    async def heard(self, beat: Heartbeat, _reply_to: str | None) -> None:
        if beat.instance_id == self.instance_id:
            return
        restarted = self.instance_id is not None
        self.instance_id = beat.instance_id
        if restarted and (disk := self.disk()) is not None:
            self.log.warning("cache_tier_restarted", instance=beat.instance_id)
            disk.restarted()
            await self.schedule()

    async def _ask(self, request_id: str | None, request: CacheTierRequest) -> None:
        reply = await self.bus.request(self.subjects.cache_tier, request, CacheTierReply, ANSWER_TIMEOUT_S)
        if (disk := self.disk()) is not None:
            disk.replied(request_id, request, reply)
        await self.schedule()

    async def _deadline(self, request_id: str) -> None:
        await asyncio.sleep(FETCH_DEADLINE_S)
        if (disk := self.disk()) is not None and disk.deadline_passed(request_id):
            self.log.warning("disk_tier_fetch_late", request_id=request_id)
            await self.schedule()
