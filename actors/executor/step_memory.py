"""The executor's answer to a step the device has no memory for (torch.OutOfMemoryError from its
launch), instead of dying of it.

The failed step leaves nothing the executor keeps: the step loop books the step before it, whose
tokens are whole, then forgets every sequence (`RunningBatch.forget_all`) and says so in the step
output (`schemas/step.py:OutOfMemory`). The scheduler retracts its running sequences, as a pause's
"retract" does: they wait, keep their outputs and are recomputed (reading what they had computed
back from the prefix cache), and it halves how many it runs. The executor halves its prompt tokens
per step. Both limits grow back while steps fit (actors/lib/memory_backoff.py). A step of one
sequence and no more prompt tokens than the floor has nothing smaller to become: that error is
raised, and the supervisor restarts the executor.
"""

import asyncio

import torch

from actors.executor.running_sequence import PlannedInput
from actors.lib.memory_backoff import MemoryBackoff
from schemas.step import OutOfMemory

MIN_PREFILL_TOKENS = 16  # per step: the prompt budget's floor


class StepMemory:
    def __init__(self, max_prefill_tokens: int, device: torch.device) -> None:
        self.prefill = MemoryBackoff(max_prefill_tokens, floor=MIN_PREFILL_TOKENS)
        self.device = device

    @property
    def prefill_budget(self) -> int:
        """Prompt tokens the next step may compute."""
        return self.prefill.limit

    def step_fit(self) -> None:
        self.prefill.step_fit()

    async def recover(self, error: torch.OutOfMemoryError, plan: list[PlannedInput]) -> OutOfMemory:
        """After `error` in the launch of the step `plan` describes: the report for the scheduler,
        once the device has run what the failed launch enqueued and has its cached memory back.
        Raises `error` when the step had nothing smaller to become."""
        prefill_tokens = sum(p.prefill_tokens for p in plan)
        if len(plan) <= 1 and prefill_tokens <= self.prefill.floor:
            raise error
        if prefill_tokens:
            self.prefill.out_of_memory(prefill_tokens)
        await asyncio.to_thread(_give_back_cached_memory, self.device)
        decodes = sum(1 for p in plan if p.prefill_tokens == 0)
        return OutOfMemory(len(plan), prefill_tokens + decodes, str(error).split("\n")[0])


def _give_back_cached_memory(device: torch.device) -> None:
    """The failed launch's kernels still run, reading the step's metadata from pinned memory that
    the next launch would refill before their copy, had it not waited: wait for them. Then the
    allocator's cached blocks go back to the driver, which a fragmented cache needs."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
