"""Whether the executor's steps make progress. The step loop runs each step inside `watch`; a step
that has not ended within the deadline makes the executor report itself stuck in its heartbeats
(kernel/actor.py), so `/health/ready` turns 503 naming why and the supervisor restarts it; the
scheduler then recomputes what ran, as after any executor restart.

A hang that holds the event loop (a launch that never returns) stops the heartbeats themselves,
which the supervisor takes for stuck already. This watches the hangs the loop outlives: a step
computing in a worker thread (CPU), or a GPU step whose end the loop polls for between messages.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StepWatchdog:
    """Invariant: `stuck()` is None unless something `watch`ed has run longer than `deadline_s`."""

    def __init__(self, deadline_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline_s = deadline_s
        self._clock = clock
        self._running: str | None = None  # what is watched now, for the report
        self._since = 0.0  # when it began, on `clock`

    @contextmanager
    def watch(self, what: str) -> Iterator[None]:
        """Watches the block's run (an await inside it included) as `what`, e.g. "a step of 3 sequences"."""
        self._running, self._since = what, self._clock()
        try:
            yield
        finally:
            self._running = None

    def stuck(self) -> str | None:
        """Why the executor makes no progress: what has run past the deadline, for how long; or None."""
        if self._running is None:
            return None
        elapsed_s = self._clock() - self._since
        if elapsed_s <= self.deadline_s:
            return None
        return f"{self._running} has run {elapsed_s:.1f} s, past the step deadline of {self.deadline_s:g} s"
