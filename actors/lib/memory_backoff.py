"""A limit that halves when the device runs out of memory and grows back while it does not. The
executor keeps one on the prompt tokens of a step (actors/executor/step_memory.py), the scheduler
one on the sequences it runs (actors/scheduler/batching.py): a step the device could not hold is
followed by smaller ones, and the configured sizes come back once steps fit again."""

# Steps in a row without running out of memory before a limit doubles: an out-of-memory error that
# recurs at the old size costs a retraction only now and then, and a passing spike (a few seconds
# of decode steps on a GPU) does not keep the server small for long.
RELAX_AFTER_STEPS = 256


class MemoryBackoff:
    """Invariant: `floor <= limit <= ceiling`; after `relax_after_steps` steps in a row that fit,
    the limit doubles (up to the ceiling)."""

    def __init__(self, ceiling: int, floor: int = 1, relax_after_steps: int = RELAX_AFTER_STEPS) -> None:
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.relax_after_steps = relax_after_steps
        self.limit = ceiling
        self._steps_that_fit = 0

    def out_of_memory(self, used: int) -> None:
        """A step that used `used` of what this limits ran out of memory: the limit becomes half of
        that, or of itself if less."""
        self.limit = max(self.floor, min(self.limit, used) // 2)
        self._steps_that_fit = 0

    def step_fit(self) -> None:
        """A step ran without running out of memory."""
        if self.limit >= self.ceiling:
            return
        self._steps_that_fit += 1
        if self._steps_that_fit >= self.relax_after_steps:
            self.limit = min(self.ceiling, self.limit * 2)
            self._steps_that_fit = 0
