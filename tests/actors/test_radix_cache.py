"""The radix prefix cache on its own: what a request gets back from it, and what it costs the pool."""

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.scheduler.block_pool import BlockPool
from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.radix_cache import RadixCache
from actors.scheduler.radix_node import MatchResult
from schemas.requests import Tenant

BS = 4


def make(num_blocks: int = 32) -> tuple[BlockPool, RadixCache]:
    pool = BlockPool(num_blocks)
    return pool, RadixCache(pool, BS)


def finish(pool: BlockPool, cache: RadixCache, tokens: list[int], blocks: list[int], tenant: Tenant = Tenant()) -> int:
    """What the scheduler does when a request ends: offer its blocks, then drop its own references."""
    new = cache.insert(tokens, blocks, tenant=tenant)
    pool.release(blocks)
    return new


def lookup(cache: RadixCache, tokens: list[int], tenant: Tenant = Tenant()) -> MatchResult:
    """What the scheduler does when a request first looks up its tokens: it records the lookup,
    then takes the match."""
    cache.record_lookup(tokens, tenant)
    return cache.match(tokens, tenant)


def check_refs(pool: BlockPool, cache: RadixCache, *held_by_requests: list[int]) -> None:
    """Every block's count is its number of holders: the tree (once) plus each request holding it."""
    tree = cache.cached_blocks()
    assert len(tree) == len(set(tree))
    for block in range(pool.num_blocks):
        holders = (block in tree) + sum(block in held for held in held_by_requests)
        assert pool.ref_count(block) == holders
    assert cache.stats().cached_blocks == len(tree)


def test_match_returns_the_longest_cached_prefix_in_whole_blocks():
    pool, cache = make()
    tokens = list(range(100, 112))  # three blocks
    blocks = pool.allocate(3)
    assert finish(pool, cache, tokens, blocks) == 3
    check_refs(pool, cache)

    hit = lookup(cache, tokens + [7, 8])
    assert (hit.blocks, hit.num_tokens) == (blocks, 12)
    hit = lookup(cache, tokens[:10] + [0, 0, 0])  # diverges inside the third block
    assert (hit.blocks, hit.num_tokens) == (blocks[:2], 8)
    assert lookup(cache, [1, 2, 3, 4, 5]).num_tokens == 0
    assert lookup(cache, [100, 101, 102]).num_tokens == 0  # less than one block


def test_match_always_leaves_a_token_to_compute():
    pool, cache = make()
    tokens = list(range(8))
    finish(pool, cache, tokens, pool.allocate(2))
    assert lookup(cache, tokens).num_tokens == 4  # not 8: the last position must yield logits
    assert lookup(cache, tokens + [9]).num_tokens == 8
    assert lookup(cache, tokens[:5]).num_tokens == 4
    assert lookup(cache, tokens[:4]).num_tokens == 0


def test_only_a_recorded_lookup_counts_hits():
    pool, cache = make()
    tokens = list(range(100, 112))
    finish(pool, cache, tokens, pool.allocate(3))
    assert cache.match(tokens + [0]).num_tokens == 12
    assert cache.stats() == (3, 3, 0, 0)
    cache.record_lookup(tokens + [0])
    assert cache.stats() == (3, 3, 12, 13)
    cache.record_lookup([7] * 8)  # nothing cached: queried, not hit
    assert cache.stats() == (3, 3, 12, 21)


def test_insert_keeps_the_trees_block_and_frees_the_duplicate():
    pool, cache = make(8)
    tokens = list(range(8))
    first, second = pool.allocate(2), pool.allocate(2)
    assert finish(pool, cache, tokens, first) == 2
    assert finish(pool, cache, tokens + [8, 9, 10, 11], second + pool.allocate(1)) == 1
    check_refs(pool, cache)
    assert cache.stats().cached_blocks == 3
    assert pool.num_free == 5  # `second` went back: the tree kept `first`
    assert lookup(cache, tokens + [8, 9, 10, 11, 12]).blocks[:2] == first


def test_insert_splits_a_node_where_prompts_diverge():
    pool, cache = make()
    stem = list(range(50, 58))
    a, b = stem + [1, 2, 3, 4], stem + [5, 6, 7, 8]
    blocks_a = pool.allocate(3)
    finish(pool, cache, a, blocks_a)
    hit = lookup(cache, b + [0])
    assert hit.blocks == blocks_a[:2]
    cache.lock(hit.node)
    pool.retain(hit.blocks)
    blocks_b = hit.blocks + pool.allocate(1)
    cache.unlock(hit.node)
    assert finish(pool, cache, b, blocks_b) == 1
    check_refs(pool, cache)
    assert lookup(cache, a + [0]).blocks == blocks_a
    assert lookup(cache, b + [0]).blocks == blocks_b
    assert cache.stats().cached_blocks == 4


def test_locked_prefixes_are_never_evicted():
    pool, cache = make(8)
    tokens = list(range(16))
    finish(pool, cache, tokens, pool.allocate(4))
    hit = lookup(cache, tokens[:9])
    cache.lock(hit.node)
    pool.retain(hit.blocks)
    assert cache.stats().evictable_blocks == 2
    assert cache.evict(100) == 2  # only the unlocked tail
    check_refs(pool, cache, hit.blocks)
    assert lookup(cache, tokens + [0]).blocks == hit.blocks
    cache.unlock(hit.node)
    pool.release(hit.blocks)
    assert cache.flush() == 2
    assert pool.num_free == 8
    with pytest.raises(ValueError):
        cache.unlock(hit.node)


def test_eviction_takes_the_least_recently_used_leaf_first():
    pool, cache = make()
    old, new = [1] * 8, [2] * 8
    finish(pool, cache, old, pool.allocate(2))
    finish(pool, cache, new, pool.allocate(2))
    lookup(cache, old + [0])  # touched: now the newer one
    assert cache.evict(1) == 2  # a whole node
    assert lookup(cache, old + [0]).num_tokens == 8
    assert lookup(cache, new + [0]).num_tokens == 0


def test_eviction_climbs_to_parents_that_become_leaves():
    pool, cache = make()
    stem = [9] * 4
    finish(pool, cache, stem + [1] * 4, pool.allocate(2))
    hit = lookup(cache, stem + [2] * 5)
    cache.lock(hit.node)
    pool.retain(hit.blocks)
    blocks = hit.blocks + pool.allocate(1)
    cache.unlock(hit.node)
    finish(pool, cache, stem + [2] * 4, blocks)
    assert cache.stats() == (3, 3, 4, 9)
    assert cache.evict(3) == 3
    assert pool.num_free == pool.num_blocks
    assert cache.stats().cached_blocks == 0


def test_insert_rejects_a_partial_block():
    pool, cache = make()
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3, 4, 5], pool.allocate(2))


def test_disabled_cache_matches_and_stores_nothing():
    pool = BlockPool(8)
    cache = RadixCache(pool, BS, enabled=False)
    blocks = pool.allocate(2)
    assert cache.insert(list(range(8)), blocks) == 0
    pool.release(blocks)
    assert lookup(cache, list(range(9))).num_tokens == 0
    assert pool.num_free == 8 and cache.stats() == (0, 0, 0, 0)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# Two users of t1 among them: they read apart, and count as one tenant toward publication.
TENANTS = [Tenant("t1"), Tenant("t1", "u1"), Tenant("t2"), Tenant("t3")]
WINDOW_S = 20.0


@settings(max_examples=100, deadline=None)
@given(data=st.data(), num_blocks=st.sampled_from([6, 12, 40]), min_tenants=st.sampled_from([1, 2, 3]))
def test_random_requests_only_ever_get_blocks_they_may_read(data, num_blocks, min_tenants):
    """Requests of a few tenants over a few shared stems start (match, lock, allocate the rest,
    evicting if short), run, and end (insert, unlock, release) in random order, among evictions,
    publications and the clock moving on: every matched block holds exactly the prefix it is
    matched for, its tenant may read it (it stored that prefix itself, an admin published it, or
    `min_tenants` tenants, told apart by name, sent it within the window), and every count is its
    number of holders."""
    clock = Clock()
    pool = BlockPool(num_blocks)
    cache = RadixCache(pool, BS, tenancy=TenancyPolicy(min_tenants, WINDOW_S), hit_half_life_s=10.0, clock=clock)
    holds_prefix: dict[int, tuple] = {}  # block -> the tokens up to its end it was written for
    # What each tenant may read, by a whole-block prefix; never less than the cache lets it.
    stored_by: dict[tuple, set[Tenant]] = defaultdict(set)  # tenants that ever stored the prefix
    sent_at: dict[tuple, dict[str, float]] = defaultdict(dict)  # tenant name -> its last send of the prefix
    public: set[tuple] = set()  # published by an admin, or sent by enough tenants at some time

    def send(tenant: Tenant, tokens: list[int]) -> None:
        for end in range(BS, len(tokens) + 1, BS):
            prefix = tuple(tokens[:end])
            sent_at[prefix][tenant.name] = clock.now
            if sum(clock.now - at <= WINDOW_S for at in sent_at[prefix].values()) >= min_tenants:
                public.add(prefix)

    running: list[tuple[Tenant, list[int], list[int], object]] = []
    stems = data.draw(st.lists(st.lists(st.integers(0, 3), min_size=5, max_size=12), min_size=1, max_size=3))
    for _ in range(data.draw(st.integers(1, 60))):
        actions = ["start"] * 3 + ["finish"] * 3 * bool(running) + ["evict", "publish", "wait"]
        action = data.draw(st.sampled_from(actions))
        if action == "finish":
            tenant, tokens, blocks, node = running.pop(data.draw(st.integers(0, len(running) - 1)))
            full = data.draw(st.integers(0, len(tokens) // BS))  # how far the KV got computed
            send(tenant, tokens[: full * BS])
            for end in range(BS, full * BS + 1, BS):
                stored_by[tuple(tokens[:end])].add(tenant)
            cache.insert(tokens[: full * BS], blocks[:full], tenant=tenant)
            cache.unlock(node)
            pool.release(blocks)
        elif action == "start":
            tenant = data.draw(st.sampled_from(TENANTS))
            tokens = data.draw(st.sampled_from(stems)) + data.draw(st.lists(st.integers(0, 3), max_size=8))
            send(tenant, tokens[: (len(tokens) - 1) // BS * BS])
            hit = lookup(cache, tokens, tenant)
            assert hit.num_tokens == len(hit.blocks) * BS < len(tokens)
            for i, block in enumerate(hit.blocks):
                prefix = tuple(tokens[: (i + 1) * BS])
                assert holds_prefix[block] == prefix
                assert tenant in stored_by[prefix] or prefix in public
            cache.lock(hit.node)
            need = -(-len(tokens) // BS) - len(hit.blocks)
            if need > pool.num_free:
                cache.evict(need - pool.num_free)
            fresh = pool.allocate(need)
            if fresh is None:
                cache.unlock(hit.node)
            else:
                pool.retain(hit.blocks)
                for i, block in enumerate(fresh, start=len(hit.blocks)):
                    holds_prefix[block] = tuple(tokens[: (i + 1) * BS])
                running.append((tenant, tokens, hit.blocks + fresh, hit.node))
        elif action == "evict":
            cache.evict(data.draw(st.integers(1, 3)))
        elif action == "publish":
            stem = data.draw(st.sampled_from(stems))
            tokens = stem[: data.draw(st.integers(0, len(stem)))]
            cache.publish(tokens)
            public.update(tuple(tokens[:end]) for end in range(BS, len(tokens) + 1, BS))
        else:
            clock.now += data.draw(st.sampled_from([1.0, 5.0, 30.0]))
        held = [blocks for _, _, blocks, _ in running]
        check_refs(pool, cache, *held)
        usage = cache.usage()
        assert usage.evictable_blocks == sum(all(b not in h for h in held) for b in cache.cached_blocks())
        assert usage.evictable_blocks + usage.locked_blocks == usage.cached_blocks
        assert usage.free_blocks == pool.num_free
    for *_, blocks, node in running:
        cache.unlock(node)
        pool.release(blocks)
    cached = cache.stats().cached_blocks
    assert cache.flush() == cached
    assert cache.stats().cached_blocks == 0 and pool.num_free == num_blocks
