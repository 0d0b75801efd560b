"""The limit both the executor (prompt tokens per step) and the scheduler (running sequences) keep
against running out of device memory: halved from what failed, never under its floor, doubled back
to its ceiling while steps fit."""

from actors.lib.memory_backoff import MemoryBackoff


def test_the_limit_halves_what_failed_and_stops_at_the_floor():
    backoff = MemoryBackoff(ceiling=256, floor=16)
    backoff.out_of_memory(used=100)  # the failed step used less than allowed: half of what it used
    assert backoff.limit == 50
    backoff.out_of_memory(used=200)  # more than the limit (a step planned before it fell): half the limit
    assert backoff.limit == 25
    for _ in range(5):
        backoff.out_of_memory(used=25)
    assert backoff.limit == 16


def test_the_limit_grows_back_while_steps_fit():
    backoff = MemoryBackoff(ceiling=100, relax_after_steps=3)
    backoff.out_of_memory(used=40)
    limits = []
    for _ in range(12):
        backoff.step_fit()
        limits.append(backoff.limit)
    assert limits == [20, 20, 40, 40, 40, 80, 80, 80, 100, 100, 100, 100]


def test_a_failure_starts_the_count_of_steps_that_fit_again():
    backoff = MemoryBackoff(ceiling=100, relax_after_steps=3)
    backoff.out_of_memory(used=40)
    backoff.step_fit()
    backoff.step_fit()
    backoff.out_of_memory(used=20)
    backoff.step_fit()
    backoff.step_fit()
    assert backoff.limit == 10
    backoff.step_fit()
    assert backoff.limit == 20
