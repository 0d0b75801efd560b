"""Launches the executor's next step and collects the one in flight: on the event loop where the
runner only enqueues (a GPU), in a worker thread where it computes the whole step (the CPU). A
step the device has no memory for is survived (step_memory.py), a step that hangs is seen
(step_watchdog.py). The step loop (actor.py) calls `StepLauncher.step` once a pass.
"""

import asyncio
import time

import torch

from actors.executor.grammars import StepMasks
from actors.executor.kv_moves import KVMoves
from actors.executor.running_batch import KVMove
from actors.executor.running_sequence import PlannedInput
from actors.executor.step_memory import StepMemory
from actors.executor.step_watchdog import StepWatchdog
from gpu.runner import ModelRunner
from gpu.step_io import PendingStep, SequenceInput
from schemas.step import OutOfMemory

# A launch on the event loop longer than this is logged: the loop served nothing meanwhile, and at
# three times this (three missed heartbeats) the supervisor takes the executor for stuck.
SLOW_LAUNCH_S = 1.0


class StepLauncher:
    """Launches steps on the actor's runner, after the KV moves they need (`moves`), under the
    actor's `watchdog`, shrinking its prompt budget (`memory`) when the device runs out."""

    def __init__(self, runner: ModelRunner, moves: KVMoves, watchdog: StepWatchdog, memory: StepMemory, log) -> None:
        self.runner = runner
        self.moves = moves
        self.watchdog = watchdog
        self.memory = memory
        self.log = log

    async def step(
        self,
        copies: list[KVMove],
        inputs: list[SequenceInput],
        plan: list[PlannedInput],
        previous: PendingStep | None,
        masks: StepMasks | None = None,
    ) -> tuple[PendingStep | None, list[int | None] | None, OutOfMemory | None]:
        """Launches the next step and collects the one in flight, under the watchdog's eye. A
        launch the device has no memory for launches nothing; the step before is collected all the
        same, and the report of the failure comes third. `masks`: of the launch's constrained draws."""
        with self.watchdog.watch(f"a step of {len(inputs)} sequences"):
            try:
                launched, tokens = await self._launch_then_collect(copies, inputs, previous, masks)
            except torch.OutOfMemoryError as error:
                out_of_memory = await self.memory.recover(error, plan)
                self.log.warning(
                    "step_out_of_memory",
                    sequences=out_of_memory.sequences,
                    tokens=out_of_memory.tokens,
                    prefill_budget=self.memory.prefill_budget,
                )
                return None, await self._collect(previous), out_of_memory
        if inputs:
            self.memory.step_fit()
        return launched, tokens, None

    async def _launch_then_collect(
        self,
        copies: list[KVMove],
        inputs: list[SequenceInput],
        previous: PendingStep | None,
        masks: StepMasks | None = None,
    ) -> tuple[PendingStep | None, list[int | None] | None]:
        """Enqueues the next step behind the one in flight, then waits for that one's tokens, so
        the GPU has work queued while the host books and publishes.

        On a GPU a launch returns once the step is enqueued, after its host work (a millisecond or
        a few), so both happen on the event loop, which polls for the step's end between bus
        messages: handing them to a worker thread cost two thread wake-ups a step, a visible share
        of a small model's first token. The loop serves nothing while a launch runs, so a launch
        must stay well under the heartbeats' 3 s; one over SLOW_LAUNCH_S is logged. Start-up
        captures the graphs, which compiles and loads the kernels, so later launches stay far under
        it. On the CPU a launch computes the whole step, so it runs in a worker thread, and the bus
        and the heartbeats are served meanwhile. Measurements: docs/journal/benchmarks.md, section
        "Low-load TTFT: the executor launches on its event loop". A launch with constrained draws
        (`masks`) waits inside for the previous step's tokens, after enqueueing its forward pass
        (grammars.py): on a GPU the loop is blocked for that wait, at most the step in flight."""
        if not self.runner.launches_asynchronously:
            return await asyncio.to_thread(self._launch_then_wait, copies, inputs, previous, masks)
        started = time.perf_counter()
        launched = self._launch(copies, inputs, masks)
        if (blocked_s := time.perf_counter() - started) > SLOW_LAUNCH_S:
            self.log.warning(
                "slow_launch",
                seconds=round(blocked_s, 3),
                sequences=len(inputs),
                tokens=sum(len(s.token_ids) for s in inputs),
            )
        return launched, await self._collect(previous)

    @staticmethod
    async def _collect(step: PendingStep | None) -> list[int | None] | None:
        """The tokens of a launched step, polled for on the loop."""
        if step is None:
            return None
        while not step.done():  # busy-waits, as cudaEventSynchronize usually does
            await asyncio.sleep(0)
        return step.tokens()

    def _launch_then_wait(
        self,
        copies: list[KVMove],
        inputs: list[SequenceInput],
        previous: PendingStep | None,
        masks: StepMasks | None = None,
    ) -> tuple[PendingStep | None, list[int | None] | None]:
        """In a worker thread: launches, then blocks until the previous step's tokens are on the host."""
        return self._launch(copies, inputs, masks), previous.tokens() if previous else None

    def _launch(
        self, copies: list[KVMove], inputs: list[SequenceInput], masks: StepMasks | None = None
    ) -> PendingStep | None:
        self.moves.apply(copies)
        return self.runner.launch(inputs, masks) if inputs else None
