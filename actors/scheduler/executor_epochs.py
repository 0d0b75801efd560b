"""Which executor epoch the scheduler follows.

An executor names each epoch with a new id: at its start, after a bus outage, when another scheduler
takes over. Its step outputs carry that id, and the scheduler applies only the outputs of the epoch
it follows: an older epoch's outputs answer commands this scheduler's books no longer hold. An epoch
is announced on the info subject; this object also asks for it, at the start, after a bus outage,
and when an output names an id it never heard of (the announcement lost to the bus).
"""

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine

from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.step import DescribeExecutor, ExecutorInfo

DESCRIBE_TIMEOUT_S = 2.0
STALE_IDS_KEPT = 16  # epochs end at bus outages and scheduler changes: a few are ever in flight


class ExecutorEpochs:
    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        spawn: Callable[[Coroutine, str], asyncio.Task],
        on_new_epoch: Callable[[ExecutorInfo, str | None], Awaitable[None]],
    ) -> None:
        self.bus, self.subjects, self.spawn = bus, subjects, spawn
        self.on_new_epoch = on_new_epoch  # (the new epoch, the id followed before): rebuilds the scheduler's books
        self.executor_id: str | None = None
        # Ids known not to be the current one (followed before, or asked about): their late outputs
        # are stale, not news of an epoch this scheduler missed.
        self._stale_ids: deque[str] = deque(maxlen=STALE_IDS_KEPT)
        self._confirming = False  # a describe asked on an output of an unknown id is under way

    async def heard(self, info: ExecutorInfo, _reply_to: str | None = None) -> None:
        """An executor's announcement, or its answer to a describe."""
        if info.executor_id == self.executor_id:
            return
        previous, self.executor_id = self.executor_id, info.executor_id
        if previous is not None:
            self._stale_ids.append(previous)
        await self.on_new_epoch(info, previous)

    def follows(self, executor_id: str) -> bool:
        """Whether an output of `executor_id` is to be applied. An id never heard of starts one ask."""
        if executor_id == self.executor_id:
            return True
        if executor_id not in self._stale_ids and not self._confirming:
            self.spawn(self._confirm(executor_id), "confirm_executor")
        return False

    async def find(self, resync: bool = False) -> None:
        """Asks until an executor answers (later restarts announce themselves on the info subject),
        then asks again, with a describe that starts no epoch, until the executor names the id this
        scheduler follows. After a bus outage the executor's own reconnection starts an epoch too,
        and broadcasts it; that broadcast (one hop: its subscription) can be handled before the
        reply to a resync that came just before it (two: nats-py's reply inbox, then this task).
        Following the older id, the scheduler dropped every step output: its requests ran for ever
        in its books, and a weight update's "wait" pause waited for them for ever."""
        while True:
            reply = await self.bus.request(
                self.subjects.executor_describe, DescribeExecutor(resync), ExecutorInfo, DESCRIBE_TIMEOUT_S
            )
            if not isinstance(reply, ExecutorInfo):
                await asyncio.sleep(0.2)
                continue
            if not resync and reply.executor_id == self.executor_id:
                return
            await self.heard(reply)
            resync = False

    async def _confirm(self, unknown_id: str) -> None:
        """An output names an epoch this scheduler never followed: the executor started one whose
        broadcast was lost (the bus flapping again), its broadcast is still on its way, or it is an
        epoch already replaced. Asking settles it; without it, in the first case, every later output
        would be dropped."""
        self._confirming = True
        try:
            await self.find()
        finally:
            self._confirming = False
        if unknown_id != self.executor_id:
            self._stale_ids.append(unknown_id)
