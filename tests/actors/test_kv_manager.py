"""The KV manager on its own, over a real block pool and radix cache: the blocks a sequence gets
when it starts, forks or grows, what it leaves to the cache, and what it costs the pool."""

from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.kv_manager import KVManager
from actors.scheduler.sequence import Sequence
from actors.scheduler.tier_figures import cache_report
from schemas.admin import PrefixPublished
from schemas.generate import SamplingParams
from schemas.requests import Tenant
from schemas.step import CopyBlock

BS = 4
PROMPT = list(range(100, 110))  # two full blocks and two tokens


def make(num_blocks: int = 16, prefix_caching: bool = True) -> KVManager:
    return KVManager(num_blocks, BS, prefix_caching, TenancyPolicy())


def sequence(name: str, prompt: list[int] = PROMPT, tenant: Tenant = Tenant()) -> Sequence:
    return Sequence(name, list(prompt), SamplingParams(max_tokens=8), "origin", 0, tenant=tenant)


def run_to_the_end_of_the_prompt(kv: KVManager, seq: Sequence) -> None:
    """As the executor reports it: the whole prompt computed."""
    seq.start_run(seq.cached.num_tokens)
    seq.prefill_done = seq.computed_len = len(seq.prefill_ids)


def test_a_start_reads_the_cached_prefix_and_gets_fresh_blocks_for_the_rest():
    kv = make()
    first = sequence("first")
    assert kv.start(first)
    assert len(first.blocks) == 3 and first.cached.num_tokens == 0  # 10 tokens and room for one more
    run_to_the_end_of_the_prompt(kv, first)
    kv.release(first)
    assert (first.blocks, first.cached) == ([], None)
    assert kv.cache.stats().cached_blocks == 2 and kv.pool.num_free == 14  # the full blocks stay cached

    again = sequence("again")
    assert kv.start(again)
    assert again.cached.num_tokens == 8 and again.blocks[:2] == again.cached.blocks
    assert kv.cache.stats().evictable_blocks == 0  # locked while it reads them
    assert all(kv.pool.ref_count(b) == 2 for b in again.cached.blocks)  # the tree's and its own


def test_only_a_requests_first_start_counts_in_the_hit_figures():
    kv = make()
    seq = sequence("r")
    assert kv.start(seq)
    kv.release(seq)  # preempted before anything was computed
    assert kv.start(seq)
    assert kv.cache.stats().queried_tokens == len(PROMPT)


def test_a_start_that_cannot_have_its_blocks_holds_nothing():
    kv = make(num_blocks=4)
    big = sequence("big", list(range(12)))
    assert kv.start(big)  # 4 blocks: the whole pool
    waits = sequence("waits")
    assert not kv.start(waits)
    assert (waits.blocks, waits.cached) == ([], None) and kv.pool.num_free == 0


def test_allocation_evicts_cached_prefixes_no_sequence_reads():
    kv = make(num_blocks=4)
    done = sequence("done", list(range(12)) + [50])
    assert kv.start(done)
    done.start_run(0)
    done.prefill_done = done.computed_len = 12
    kv.release(done)
    assert kv.cache.stats().cached_blocks == 3 and kv.pool.num_free == 1
    other = sequence("other", list(range(200, 210)))
    assert kv.start(other)  # 3 blocks: 1 free, 2 from the cache
    assert kv.cache.stats().cached_blocks == 0 and kv.pool.num_free == 1  # a whole node went: one block more


def test_allocation_never_evicts_a_prefix_a_sequence_reads():
    kv = make(num_blocks=4)
    done = sequence("done", list(range(12)) + [50])
    assert kv.start(done)
    done.start_run(0)
    done.prefill_done = done.computed_len = 12
    kv.release(done)
    reader = sequence("reader", list(range(8)) + [60])  # reads two of the three cached blocks
    assert kv.start(reader) and reader.cached.num_tokens == 8
    assert not kv.start(sequence("other", list(range(200, 210))))  # would need the locked blocks
    assert kv.cache.stats() == (3, 1, 8, 32)  # nothing evicted, not even the block it could have had


def test_a_fork_shares_the_prompt_and_copies_the_block_of_its_last_token():
    kv = make()
    parent, child = sequence("c0"), sequence("c1")
    assert kv.start(parent)
    copy = kv.fork(child, parent)
    assert child.blocks[:2] == parent.blocks[:2]  # tokens 0..7: shared
    assert copy == CopyBlock(parent.blocks[2], child.blocks[2])  # tokens 8..9, and room for one more
    assert len(child.blocks) == 3 and child.cached.num_tokens == 0
    assert all(kv.pool.ref_count(b) == 2 for b in parent.blocks[:2])
    kv.release(child)
    kv.release(parent)
    assert kv.pool.num_free + kv.cache.stats().cached_blocks == 16


def test_grow_adds_blocks_only_when_needed_and_all_or_nothing():
    kv = make(num_blocks=5)
    seq = sequence("r")
    assert kv.start(seq)
    assert kv.grow(seq, 12) == []  # room for 12 tokens already
    assert len(kv.grow(seq, 14)) == 1 and len(seq.blocks) == 4
    assert kv.grow(seq, 30) is None and len(seq.blocks) == 4 and kv.pool.num_free == 1


def test_a_completed_prefill_is_cached_at_once_and_held_by_its_sequence():
    kv = make()
    seq = sequence("r")
    assert kv.start(seq)
    run_to_the_end_of_the_prompt(kv, seq)
    kv.cache_prefill(seq)
    assert seq.cached.blocks == seq.blocks[:2]  # now it holds the stored prefix against eviction
    assert kv.cache.stats() == (2, 0, 0, len(PROMPT))
    peer = sequence("peer")
    assert kv.start(peer) and peer.cached.blocks == seq.blocks[:2]  # read while the first one runs


def test_reports_and_publication():
    kv = make()
    seq = sequence("r", tenant=Tenant("a"))
    assert kv.start(seq)
    run_to_the_end_of_the_prompt(kv, seq)
    kv.cache_prefill(seq)
    report = cache_report(kv, [seq])
    assert (report.total_blocks, report.cached_blocks, report.in_use_blocks) == (16, 2, 3)
    assert report.private_blocks == {"a": 2}
    assert kv.publish(PROMPT) == PrefixPublished(8, 2)  # whole blocks of the text; both cached ones opened
    assert cache_report(kv, [seq]).public_blocks == 2
    kv.release(seq)
    assert kv.flush() == 2 and kv.pool.num_free == 16


def test_a_run_scoring_its_prompt_reuses_no_more_than_the_positions_before_its_first_score():
    """Prompt logprobs from position s need the logits of positions s - 1 on: the cached prefix
    read stops there (in whole blocks), and a run with outputs, which scores nothing, reads it all."""
    kv = make()
    first = sequence("first")
    assert kv.start(first)
    run_to_the_end_of_the_prompt(kv, first)
    kv.release(first)  # PROMPT's two full blocks are cached
    for scored_from, reused in [(None, 8), (10, 8), (9, 8), (8, 4), (5, 4), (4, 0), (1, 0), (0, 0)]:
        seq = Sequence(f"s{scored_from}", list(PROMPT), SamplingParams(prompt_logprobs_from=scored_from), "o", 0)
        assert kv.start(seq)
        assert seq.cached.num_tokens == reused, scored_from
        kv.release(seq)
    resumed = Sequence("resumed", list(PROMPT), SamplingParams(prompt_logprobs_from=0), "o", 0, output_ids=[7])
    assert not resumed.scores_prompt and kv.start(resumed) and resumed.cached.num_tokens == 8
