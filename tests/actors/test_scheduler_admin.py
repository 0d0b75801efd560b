"""The scheduler's admin conversations on the plain object, without a bus: what a pause aborts and
holds, the continue, stats while paused, a flush, and the commit of new weights."""

import structlog

from actors.scheduler.admin import PauseChanged, SchedulerAdmin, scheduler_stats
from actors.scheduler.batching import ContinuousBatcher
from actors.scheduler.sequence import Sequence
from actors.scheduler.sessions import SessionTable
from schemas.admin import CacheFlushed, ContinueGeneration, FlushCache, GetPause, GetStats, PauseGeneration, PauseState
from schemas.errors import Error
from schemas.generate import SamplingParams
from schemas.scheduler_weights import CacheGeneration, WeightsCommitted

BS = 4
PROMPT = list(range(100, 110))  # two full blocks and two tokens


async def no_disk_tier() -> int:
    raise AssertionError("a server without a disk tier never asks the cache_tier to flush")


def admin() -> SchedulerAdmin:
    batcher = ContinuousBatcher(16, BS, 64, 1000)
    return SchedulerAdmin(batcher, SessionTable(batcher.kv.cache, 32), no_disk_tier, structlog.get_logger())


def queued(admin: SchedulerAdmin, *names: str) -> None:
    for name in names:
        assert admin.batcher.submit(name, list(PROMPT), SamplingParams(max_tokens=8), "origin") is None


def cached_prompt(admin: SchedulerAdmin) -> None:
    """The prompt's two full blocks computed and left in the prefix cache."""
    kv = admin.batcher.kv
    seq = Sequence("done", list(PROMPT), SamplingParams(max_tokens=8), "origin", 0)
    assert kv.start(seq)
    seq.start_run(seq.cached.num_tokens)
    seq.prefill_done = seq.computed_len = len(seq.prefill_ids)
    kv.release(seq)


def test_an_abort_pause_hands_back_what_it_ended_and_the_continue_reopens():
    a = admin()
    queued(a, "r1", "r2")
    changed = a.answer(PauseGeneration("abort"))
    assert isinstance(changed, PauseChanged)
    assert sorted(seq.request_id for seq in changed.aborted) == ["r1", "r2"]
    assert a.pause_state() == PauseState(True, "abort", 2, 0)
    queued(a, "late")  # waits in the queue while paused
    assert a.answer(GetPause()) == PauseState(True, "abort", 2, 1)
    assert a.answer(GetStats()).waiting == 1
    assert a.answer(ContinueGeneration()) == PauseChanged([])
    assert a.pause_state() == PauseState(False, None)
    refused = a.answer(ContinueGeneration())  # nothing to continue: the out-of-order call is seen
    assert isinstance(refused, Error) and refused.code == "invalid_request"


async def test_a_flush_frees_the_cached_blocks_of_the_tiers_this_server_has():
    a = admin()
    cached_prompt(a)
    assert await a.flush(FlushCache().tier) == CacheFlushed(2, {"gpu": 2})
    assert scheduler_stats(a.batcher).free_blocks == 16
    assert await a.flush("all") == CacheFlushed(0, {"gpu": 0})  # neither a host nor a disk tier


def test_new_weights_start_a_cache_generation_unless_the_update_keeps_the_cache():
    a = admin()
    cached_prompt(a)
    assert a.weights_committed(WeightsCommitted("1", keep_cache=True)) == CacheGeneration(0, 0)
    assert a.weights_committed(WeightsCommitted("2", keep_cache=False)) == CacheGeneration(1, 2)
    assert scheduler_stats(a.batcher).free_blocks == 16
