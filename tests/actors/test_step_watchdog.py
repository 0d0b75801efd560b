"""The executor's step watchdog: a step that outlasts the deadline makes the executor stuck, and
one that ends in time, or nothing running, does not."""

import asyncio
import threading

from actors.executor.step_watchdog import StepWatchdog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_step_past_the_deadline_is_reported_with_what_it_was_and_how_long():
    clock = Clock()
    watchdog = StepWatchdog(deadline_s=30, clock=clock)
    assert watchdog.stuck() is None  # nothing runs
    with watchdog.watch("a step of 3 sequences"):
        clock.now += 30
        assert watchdog.stuck() is None  # at the deadline, not past it
        clock.now += 1.5
        assert watchdog.stuck() == "a step of 3 sequences has run 31.5 s, past the step deadline of 30 s"
    assert watchdog.stuck() is None  # it ended: the executor moves again


def test_each_step_is_timed_from_its_own_start():
    clock = Clock()
    watchdog = StepWatchdog(deadline_s=5, clock=clock)
    for _ in range(10):  # many steps, each in time, adding up to far more than the deadline
        with watchdog.watch("a step of 1 sequences"):
            clock.now += 4
        clock.now += 4  # idle between steps: nothing is watched
        assert watchdog.stuck() is None


def test_a_step_that_raises_is_no_longer_watched():
    clock = Clock()
    watchdog = StepWatchdog(deadline_s=5, clock=clock)
    try:
        with watchdog.watch("a step of 2 sequences"):
            raise RuntimeError("the step failed")
    except RuntimeError:
        pass
    clock.now += 60
    assert watchdog.stuck() is None


async def test_a_step_in_a_worker_thread_that_hangs_is_seen_while_the_loop_runs():
    """The CPU's way: the loop awaits the step's thread and keeps serving, so it can report."""
    watchdog = StepWatchdog(deadline_s=0.2)
    release = threading.Event()

    async def hung_step() -> None:
        with watchdog.watch("a step of 4 sequences"):
            await asyncio.to_thread(release.wait)

    step = asyncio.create_task(hung_step())
    reports = []
    for _ in range(20):  # what the heartbeat loop would send meanwhile
        await asyncio.sleep(0.05)
        reports.append(watchdog.stuck())
    release.set()
    await step
    assert reports[0] is None and reports[-1].startswith("a step of 4 sequences has run")
    assert watchdog.stuck() is None
