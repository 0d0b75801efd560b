"""The executor's side of `<ns>.executor.weights`, from the weight_sync actor: new weights, the
trainer's group, reads of a weight, renames of the version, memory by tag.

A request waits in a queue until the step loop runs it between two steps with no step in flight
(`ExecutorActor._step_loop`), in a worker thread, so the bus and the heartbeats are served while a
checkpoint loads (the few that take milliseconds run on the loop). Nothing computes while the
weights change, so every step's tokens come from one version's weights, the version its StepOutput
names. A failed update left the old weights serving (gpu/weight_receiver.py: refused before a byte
was written, or rolled back) under the old version.
"""

import asyncio
from collections.abc import Callable

import torch

from actors.lib.weights_fingerprint import updated_fingerprint
from gpu.runner import ModelRunner
from gpu.weight_check import WeightError
from gpu.weight_receiver import UpdateReport, WeightReceiver
from schemas.admin_weights import WeightValues, WeightVersion
from schemas.errors import Error
from schemas.executor_weights import (
    ApplyWeights,
    DiskSource,
    ExecutorWeightsReply,
    ExecutorWeightsRequest,
    GroupJoined,
    GroupSource,
    IpcSource,
    JoinWeightGroup,
    LeaveWeightGroup,
    ReadWeight,
    SetVersion,
    WeightsApplied,
    WeightSource,
)
from schemas.sleep import GetMemory, MemoryState, ReleaseMemory, ResumeMemory

# A trainer that stops broadcasting mid-update (it died) must not hold the executor for ever: past
# this the receive is aborted, the group reset and the old weights restored.
GROUP_DEADLINE_S = 120.0


class WeightRequests:
    """Requests queued by `ask`, run by `run_waiting`. `version`: of the weights serving now;
    `join_timeout_s`: how long a join waits for the trainer's ranks (--weight-group-join-timeout-s),
    during which no step runs."""

    def __init__(
        self, runner: ModelRunner, version: str, fingerprint: str, wake: Callable[[], None], join_timeout_s: float
    ) -> None:
        self.version = version
        self.join_timeout_s = join_timeout_s
        self.fingerprint = fingerprint  # of the weights served now (actors/lib/block_hashes.py)
        self.memory = runner.memory  # gpu/memory_occupation.py: sleep and wake by tag
        self.receiver = WeightReceiver(runner.model, runner.host_weights, runner.device)
        self._wake = wake  # the step loop's: it runs the queue once nothing is in flight
        self._queue: list[tuple[ExecutorWeightsRequest, asyncio.Future]] = []

    @property
    def waiting(self) -> bool:
        return bool(self._queue)

    @property
    def asleep(self) -> bool:
        """Whether the weights or the KV pool are released: no step may launch until they are back."""
        return not self.memory.resident

    async def ask(self, message: ExecutorWeightsRequest, _reply_to: str | None) -> ExecutorWeightsReply | Error:
        """The subscription's handler: queues `message` and answers once the step loop ran it."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append((message, future))
        self._wake()
        return await future

    async def run_waiting(self) -> None:
        """Runs the queued requests, in order; call only with no step in flight."""
        while self._queue:
            message, future = self._queue.pop(0)
            if self._quick(message):
                reply = self._run(message)
            else:
                reply = await asyncio.to_thread(self._run, message)
            if not future.cancelled():
                future.set_result(reply)

    def _quick(self, message: ExecutorWeightsRequest) -> bool:
        """Whether `message` runs in a few milliseconds, so on the loop itself: a rename, or a CUDA
        IPC bucket into resident weights (device copies). A trainer sends an IPC update per bucket
        and waits for each answer; a worker thread's handoff and wait for the GIL cost as much.
        (CPU tensors arrive through the trainer's socket, which is not to be waited on here.)"""
        if isinstance(message, SetVersion):
            return True
        ipc = isinstance(message, ApplyWeights) and isinstance(message.source, IpcSource)
        return ipc and self.receiver.device.type == "cuda" and "weights" not in self.memory.released

    def _run(self, message: ExecutorWeightsRequest) -> ExecutorWeightsReply | Error:
        try:
            match message:
                case ApplyWeights(update_id=update_id, source=source, version=version, full=full):
                    if "weights" in self.memory.released:  # asleep: the update writes where they wake
                        self.memory.resume({"weights"})
                    report = self._apply(source, full)
                    self.version = version
                    self.fingerprint = updated_fingerprint(self.fingerprint, update_id)
                    return WeightsApplied(version, report.tensors, report.bytes, report.seconds)
                case SetVersion(version):
                    self.version = version
                    return WeightVersion(version)
                case ReadWeight(name, truncate_size):
                    read = self.receiver.read(name, truncate_size)
                    return WeightValues(name, list(read.shape), read.dtype, read.values, read.checksum)
                case JoinWeightGroup(group):
                    self.receiver.join_group(
                        group.master_address,
                        group.master_port,
                        group.rank_offset,
                        group.world_size,
                        group.group_name,
                        group.backend,
                        self.join_timeout_s,
                    )
                    return GroupJoined(group.group_name)
                case LeaveWeightGroup(group_name):
                    self.receiver.leave_group(group_name)
                    return GroupJoined(
                        group_name
                    )  # the one reply naming a group: the weight_sync actor knows which it asked
                case ReleaseMemory(tags):
                    return self._memory_state(self.memory.release(tags))
                case ResumeMemory(tags):
                    return self._memory_state(self.memory.resume(tags))
                case GetMemory():
                    return self._memory_state(self.memory.released)
        except (WeightError, ValueError) as exc:  # ValueError: an unknown memory tag, named
            return Error("invalid_request", str(exc))
        except torch.OutOfMemoryError as exc:  # a wake the device has no room for: what came back stays
            return Error("unavailable", f"the device has no memory to resume into: {exc}", retriable=True)

    def _memory_state(self, released: frozenset[str]) -> MemoryState:
        return MemoryState(sorted(released), self.memory.device_bytes())

    def _apply(self, source: WeightSource, full: bool) -> UpdateReport:
        """`full`: every weight must come (a checkpoint on disk always brings them all)."""
        match source:
            case DiskSource(model_path):
                return self.receiver.apply_disk(model_path)
            case GroupSource():
                return self.receiver.apply_group(
                    source.group_name,
                    source.names,
                    source.dtypes,
                    source.shapes,
                    source.flattened,
                    source.checksums,
                    GROUP_DEADLINE_S,
                    full,
                )
            case IpcSource(payloads, flattened):
                return self.receiver.apply_ipc(payloads, flattened, full)
