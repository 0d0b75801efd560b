"""The prefix cache across weight updates: after new weights (a new generation) no KV computed
under the old ones is matched again, whether it was cached then or still held by a running
request, and every block comes back to the pool; without a new generation the cache serves on."""

from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.kv_manager import KVManager
from actors.scheduler.sequence import Sequence
from schemas.generate import SamplingParams

BS = 4
PROMPT = list(range(100, 110))  # two full blocks and two tokens


def make(num_blocks: int = 16) -> KVManager:
    return KVManager(num_blocks, BS, True, TenancyPolicy())


def sequence(name: str, prompt: list[int] = PROMPT) -> Sequence:
    return Sequence(name, list(prompt), SamplingParams(max_tokens=8), "origin", 0)


def run_prompt(seq: Sequence) -> None:
    seq.start_run(seq.cached.num_tokens)
    seq.prefill_done = seq.computed_len = len(seq.prefill_ids)


def finished(kv: KVManager, name: str, prompt: list[int] = PROMPT) -> None:
    seq = sequence(name, prompt)
    assert kv.start(seq)
    run_prompt(seq)
    kv.release(seq)


def test_a_new_generation_frees_what_is_cached_and_matches_none_of_it():
    kv = make()
    finished(kv, "before")
    assert kv.cache.stats().cached_blocks == 2
    assert kv.new_generation() == 2
    assert kv.pool.num_free == 16 and kv.cache.generation == 1
    after = sequence("after")
    assert kv.start(after) and after.cached.num_tokens == 0


def test_kept_cache_is_served_across_an_update():
    kv = make()
    finished(kv, "before")
    again = sequence("again")  # no new generation: the update kept the cache
    assert kv.start(again) and again.cached.num_tokens == 8


def test_kv_held_by_a_request_running_across_the_update_is_never_matched_or_cached():
    kv = make()
    finished(kv, "first")
    reader = sequence("reader")  # reads the two cached blocks, then runs on under the new weights
    assert kv.start(reader) and reader.cached.num_tokens == 8
    run_prompt(reader)
    kv.cache_prefill(reader)
    assert kv.new_generation() == 0  # the reader locks them: they stay for it
    assert kv.cache.stats().cached_blocks == 2
    late = sequence("late")
    assert kv.start(late) and late.cached.num_tokens == 0  # the old blocks are out of reach
    run_prompt(late)
    late_blocks = late.blocks[:2]
    kv.release(late)  # computed under the new weights: cached
    kv.cache_prefill(reader)  # a prefill that ends after the update stores nothing
    reader.output_ids += [1, 2, 3, 4, 5, 6]
    reader.computed_len = 16
    kv.release(reader)
    assert kv.cache.stats().cached_blocks == 2  # late's only; the reader's old blocks went back to the pool
    assert kv.pool.num_free == 14
    assert kv.cache.match(PROMPT).blocks == late_blocks


def test_a_fork_of_an_old_run_caches_nothing_under_new_weights():
    kv = make()
    parent, child = sequence("c0"), sequence("c1")
    assert kv.start(parent)
    kv.fork(child, parent)
    kv.new_generation()
    for seq in (parent, child):
        run_prompt(seq)
        kv.release(seq)
    assert kv.cache.stats().cached_blocks == 0 and kv.pool.num_free == 16


def test_stale_trees_of_several_generations_free_every_block():
    kv = make()
    finished(kv, "a")
    held = sequence("held")
    assert kv.start(held) and held.cached.num_tokens == 8
    kv.new_generation()
    finished(kv, "b")
    kv.new_generation()
    assert kv.cache.generation == 2 and kv.cache.stats().cached_blocks == 2  # held's, out of reach
    run_prompt(held)
    kv.release(held)
    assert kv.cache.stats()[:2] == (0, 0) and kv.pool.num_free == 16
