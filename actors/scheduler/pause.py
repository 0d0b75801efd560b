"""The pause of generation (SGLang's /pause_generation, vLLM's /pause): a plain object the
scheduler actor asks, acting on the batcher.

Every mode stops admission: requests that arrive while paused wait in the queue and are admitted
after the continue. What happens to those in flight is the mode's:
- "abort": each ends with finish_reason "abort" and the output it drew (the batcher's `abort_all`);
- "retract": the running ones go back to the queue, their KV freed, as after a preemption; readmitted
  after the continue, they recompute their prompt and outputs and draw on, greedy ones the same tokens;
- "in_place": the executor is held (`HoldStepping`): no step runs, every sequence keeps its KV and
  its blocks, and decoding resumes where it stopped;
- "wait" (vLLM's): the running ones finish.

A pause while paused applies its own mode to what is in flight then, as SGLang's does (its
scheduler sets the flag again and runs the new mode's action); the hold follows the latest mode.
"""

import msgspec

from actors.scheduler.batching import ContinuousBatcher
from actors.scheduler.sequence import Sequence
from schemas.admin import PauseMode, PauseState, SchedulerStats
from schemas.errors import Error


class GenerationPause:
    def __init__(self) -> None:
        self.mode: PauseMode | None = None  # None: not paused
        self.aborted = 0  # requests the pauses since the last continue ended

    @property
    def paused(self) -> bool:
        return self.mode is not None

    def pause(self, batcher: ContinuousBatcher, mode: PauseMode) -> list[Sequence]:
        """Applies `mode`; returns the requests it aborted, whose ends the caller sends as for any
        abort that keeps the output. The batcher's next round carries the commands."""
        aborted = batcher.abort_all(None) if mode == "abort" else []
        if mode == "retract":
            batcher.retract_running()
        if (mode == "in_place") != (self.mode == "in_place"):
            batcher.hold(mode == "in_place")
        batcher.admitting = False
        self.mode = mode
        self.aborted += len(aborted)
        return aborted

    def resume(self, batcher: ContinuousBatcher) -> Error | None:
        """Ends the pause; refused when there is none, so a client's out-of-order call is seen."""
        if self.mode is None:
            return Error("invalid_request", "generation is not paused: there is nothing to continue")
        if self.mode == "in_place":
            batcher.hold(False)
        batcher.admitting = True
        self.mode, self.aborted = None, 0
        return None

    def state(self, batcher: ContinuousBatcher) -> PauseState:
        """`held`: the requests in flight that do not advance now (in "wait" the running ones do)."""
        if self.mode is None:
            return PauseState(False, None)
        advancing = len(batcher.requests.running) if self.mode == "wait" else 0
        return PauseState(True, self.mode, self.aborted, len(batcher.sequences) - advancing)

    def stats(self, stats: SchedulerStats) -> SchedulerStats:
        """Requests an in-place pause holds count as waiting, not running: RL clients wait on the
        load routes for nothing to run before they update the weights."""
        if self.mode != "in_place":
            return stats
        return msgspec.structs.replace(stats, running=0, waiting=stats.waiting + stats.running)
