"""What the weight_sync actor asks of the others, as one typed interface: the scheduler's pause
and prefix cache, the executor's weights. The actor implements it over the bus (`BusPeers`); the
transactions (transaction.py, memory.py) are written against it alone."""

from typing import Protocol

from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.admin import (
    CacheFlushed,
    ContinueGeneration,
    FlushCache,
    GetPause,
    GetStats,
    PauseGeneration,
    PauseMode,
    PauseState,
    SchedulerStats,
)
from schemas.errors import Error
from schemas.executor_weights import ExecutorWeightsReply, ExecutorWeightsRequest
from schemas.requests import AbortAll, Aborted
from schemas.scheduler_weights import CacheGeneration, WeightsCommitted
from schemas.step import DescribeExecutor, ExecutorInfo

SCHEDULER_TIMEOUT_S = 10.0


class Peers(Protocol):
    async def pause(self, mode: PauseMode) -> PauseState | Error: ...

    async def pause_state(self) -> PauseState | Error: ...

    async def resume(self) -> PauseState | Error: ...

    async def running_requests(self) -> int | Error: ...

    async def flush_cache(self) -> CacheFlushed | Error: ...

    async def abort_all(self) -> Aborted | Error: ...

    async def commit(self, message: WeightsCommitted) -> CacheGeneration | Error: ...

    async def executor(self, message: ExecutorWeightsRequest, timeout_s: float) -> ExecutorWeightsReply | Error: ...

    async def describe_executor(self) -> ExecutorInfo | Error: ...


class BusPeers:
    """`Peers` over the bus: the scheduler's admin subjects and the executor's weights subject."""

    def __init__(self, bus: Bus, subjects: Subjects) -> None:
        self.bus = bus
        self.subjects = subjects

    async def pause(self, mode: PauseMode) -> PauseState | Error:
        return await self.bus.request(self.subjects.admin_pause, PauseGeneration(mode), PauseState, SCHEDULER_TIMEOUT_S)

    async def pause_state(self) -> PauseState | Error:
        return await self.bus.request(self.subjects.admin_pause_state, GetPause(), PauseState, SCHEDULER_TIMEOUT_S)

    async def resume(self) -> PauseState | Error:
        return await self.bus.request(
            self.subjects.admin_continue, ContinueGeneration(), PauseState, SCHEDULER_TIMEOUT_S
        )

    async def running_requests(self) -> int | Error:
        stats = await self.bus.request(self.subjects.admin_stats, GetStats(), SchedulerStats, SCHEDULER_TIMEOUT_S)
        return stats if isinstance(stats, Error) else stats.running

    async def flush_cache(self) -> CacheFlushed | Error:
        return await self.bus.request(self.subjects.admin_flush_cache, FlushCache(), CacheFlushed, SCHEDULER_TIMEOUT_S)

    async def abort_all(self) -> Aborted | Error:
        return await self.bus.request(self.subjects.scheduler, AbortAll(), Aborted, SCHEDULER_TIMEOUT_S)

    async def commit(self, message: WeightsCommitted) -> CacheGeneration | Error:
        return await self.bus.request(self.subjects.scheduler_weights, message, CacheGeneration, SCHEDULER_TIMEOUT_S)

    async def executor(self, message: ExecutorWeightsRequest, timeout_s: float) -> ExecutorWeightsReply | Error:
        return await self.bus.request(self.subjects.executor_weights, message, ExecutorWeightsReply, timeout_s)

    async def describe_executor(self) -> ExecutorInfo | Error:
        return await self.bus.request(
            self.subjects.executor_describe, DescribeExecutor(), ExecutorInfo, SCHEDULER_TIMEOUT_S
        )
