"""Tenants in the radix prefix cache: what one tenant reads of what others cached, when a prefix
becomes public (the users of one tenant counting once), and what merging and decaying hit counts do
to the pool and to eviction."""

import pytest

from actors.scheduler.block_pool import BlockPool
from actors.scheduler.cache_tenancy import TenancyPolicy, Visibility
from actors.scheduler.radix_cache import RadixCache
from schemas.requests import Tenant
from tests.actors.test_radix_cache import BS, Clock, check_refs, finish, lookup

PROMPT = list(range(100, 112))  # three blocks
A, B, C, D, E, X, Y, Z = (Tenant(name) for name in "abcdexyz")


def make(
    k: int = 3, window_s: float = 100.0, half_life_s: float = 60.0, num_blocks: int = 32
) -> tuple[BlockPool, RadixCache, Clock]:
    pool, clock = BlockPool(num_blocks), Clock()
    cache = RadixCache(pool, BS, tenancy=TenancyPolicy(k, window_s), hit_half_life_s=half_life_s, clock=clock)
    return pool, cache, clock


def ask(cache: RadixCache, tenant: Tenant, tokens: list[int]) -> int:
    """A request of `tenant` for `tokens` and one token more: it sends them, and gets back how many
    come from the cache."""
    return lookup(cache, tokens + [0], tenant).num_tokens


def test_the_policy_reads_owners_and_public_nodes_and_opens_after_k_senders():
    policy, node = TenancyPolicy(min_tenants=2, window_s=10.0), Visibility()
    assert not policy.stored(node, A, now=0.0)
    assert policy.may_read(node, A) and not policy.may_read(node, B)
    assert not policy.sent(node, A, now=5.0)  # the same tenant again
    assert policy.sent(node, B, now=12.0)  # a's latest send is 7 s old: two tenants within 10 s
    assert node.public and node.senders == {} and policy.may_read(node, Tenant("anyone"))
    assert not policy.sent(node, C, now=13.0) and not policy.open(node)  # public already

    late = Visibility()
    policy.sent(late, A, now=0.0)
    assert not policy.sent(late, B, now=11.0)  # a's send left the window
    assert late.senders == {"b": 11.0}


def test_the_users_of_one_tenant_read_apart_and_count_once_toward_publication():
    """With API keys `user` narrows a key's tenant: its users read each other's prefixes no more
    than other tenants do, yet one key sending a prefix under many users is one sender."""
    policy, node = TenancyPolicy(min_tenants=3, window_s=10.0), Visibility()
    users = [Tenant("a", f"u{i}") for i in range(5)]
    assert not policy.stored(node, users[0], now=0.0)
    assert policy.may_read(node, users[0])
    assert not any(policy.may_read(node, other) for other in (users[1], A, Tenant("a/u0")))
    assert not any(policy.sent(node, user, now=1.0) for user in users[1:])  # five users, one tenant
    assert node.senders == {"a": 1.0} and not node.public
    assert not policy.sent(node, B, now=2.0)  # two tenants
    assert policy.sent(node, C, now=3.0)
    assert all(policy.may_read(node, user) for user in users)


def test_the_policy_remembers_published_prefixes_in_whole_blocks():
    policy = TenancyPolicy()
    policy.publish(tuple(range(10)))
    assert policy.published_tokens(tuple(range(12)), block_size=4) == 8
    assert policy.published_tokens((0, 1, 2, 3, 9, 9, 9, 9), block_size=4) == 4
    assert policy.published_tokens((9,) * 8, block_size=4) == 0


def test_a_prefix_stays_private_until_k_tenants_sent_it():
    pool, cache, _ = make(k=3)
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=A)
    assert ask(cache, A, PROMPT) == 12
    assert ask(cache, B, PROMPT) == 0
    assert ask(cache, B, PROMPT) == 0  # the same tenant again is still two tenants
    assert cache.usage().private_blocks == {"a": 3}
    assert ask(cache, C, PROMPT) == 12  # the third tenant's own request already reads it
    assert ask(cache, D, PROMPT) == 12
    assert ask(cache, B, PROMPT) == 12
    assert cache.usage().public_blocks == 3 and cache.usage().private_blocks == {}


def test_a_prefix_one_tenant_sent_under_k_users_stays_private():
    """One key holder guessing a prefix under K users must not pass for K tenants: it still needs
    K - 1 others to have sent the prefix before it gets a hit."""
    pool, cache, _ = make(k=3)
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=Tenant("a", "u0"))
    assert [ask(cache, Tenant("a", f"u{i}"), PROMPT) for i in range(1, 5)] == [0, 0, 0, 0]
    assert ask(cache, B, PROMPT) == 0  # a and b: two tenants
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=Tenant("a", "u1"))  # a second user of a stores it too
    assert cache.usage().private_blocks == {"a": 3}  # counted once for its tenant
    assert ask(cache, C, PROMPT) == 12  # the third tenant
    assert ask(cache, Tenant("a", "u9"), PROMPT) == 12
    check_refs(pool, cache)


def test_a_match_alone_sends_nothing():
    pool, cache, _ = make(k=2)
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=A)
    for _ in range(3):
        assert cache.match(PROMPT + [0], B).num_tokens == 0  # a read: b is no sender yet
    assert cache.usage().private_blocks == {"a": 3}
    assert ask(cache, B, PROMPT) == 12  # a lookup: b is the second sender


def test_senders_outside_the_window_do_not_count():
    pool, cache, clock = make(k=3, window_s=100.0)
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=A)
    clock.now = 50.0
    assert ask(cache, B, PROMPT) == 0
    clock.now = 120.0  # a sent it 120 s ago: three tenants ever, two within the window
    assert ask(cache, C, PROMPT) == 0
    clock.now = 140.0  # b, c and d within 100 s
    assert ask(cache, D, PROMPT) == 12
    assert ask(cache, E, PROMPT) == 12


def test_a_tenant_reads_nothing_of_a_prefix_it_does_not_own():
    pool, cache, _ = make(k=3)
    blocks = pool.allocate(3)
    finish(pool, cache, PROMPT, blocks, tenant=A)
    hit = lookup(cache, PROMPT + [0], B)
    assert (hit.blocks, hit.num_tokens) == ([], 0)
    assert cache.stats().hit_tokens == 0
    cache.lock(hit.node)  # what the scheduler does with any match: it protects nothing of a's
    assert cache.evict(3) == 3
    cache.unlock(hit.node)
    check_refs(pool, cache)


def test_a_tenant_reads_the_public_stem_but_not_anothers_private_tail():
    pool, cache, _ = make(k=3)
    system, question = list(range(8)), [50, 51, 52, 53, 54, 55, 56, 57]
    cache.publish(system)
    blocks = pool.allocate(4)
    finish(pool, cache, system + question, blocks, tenant=A)
    hit = lookup(cache, system + question + [0], B)
    assert (hit.blocks, hit.num_tokens) == (blocks[:2], 8)
    assert ask(cache, A, system + question) == 16
    assert cache.usage().public_blocks == 2 and cache.usage().private_blocks == {"a": 2}


def test_publish_opens_a_cached_prefix_in_whole_blocks():
    pool, cache, _ = make(k=5)
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=A)
    assert cache.publish(PROMPT[:10]) == 2  # the third block is not whole in the published text
    assert ask(cache, B, PROMPT) == 8
    assert cache.publish(PROMPT[:10]) == 0  # already public
    assert cache.usage().private_blocks == {"a": 1}
    check_refs(pool, cache)


def test_publish_opens_prefixes_cached_later_too():
    pool, cache, _ = make(k=5)
    assert cache.publish(PROMPT) == 0  # nothing cached yet: remembered
    finish(pool, cache, PROMPT[:4], pool.allocate(1), tenant=A)
    assert ask(cache, B, PROMPT) == 4
    finish(pool, cache, PROMPT + [1, 2, 3, 4], pool.allocate(4), tenant=C)  # the rest, and beyond
    assert ask(cache, D, PROMPT + [1, 2, 3, 4]) == 12  # the published three blocks, not c's fourth
    assert cache.usage().public_blocks == 3 and cache.usage().private_blocks == {"c": 1}
    check_refs(pool, cache)


def test_publication_outlives_a_rebuilt_cache_of_another_block_size():
    tenancy = TenancyPolicy(5, 100.0)
    RadixCache(BlockPool(8), BS, tenancy=tenancy).publish(list(range(16)))
    pool = BlockPool(8)
    cache = RadixCache(pool, 8, tenancy=tenancy)  # a new executor: blocks of 8 tokens
    finish(pool, cache, list(range(16)), pool.allocate(2), tenant=A)
    assert ask(cache, B, list(range(16))) == 16


def test_merging_a_tenants_copy_keeps_one_copy_of_the_blocks():
    pool, cache, _ = make(k=5, num_blocks=8)
    stem, tail = PROMPT[:8], [7, 7, 7, 7]
    first = pool.allocate(2)
    assert finish(pool, cache, stem, first, tenant=A) == 2
    assert ask(cache, B, stem + tail) == 0  # b cannot read a's stem: it computes its own
    second = pool.allocate(3)
    assert finish(pool, cache, stem + tail, second, tenant=B) == 1  # only the tail is new
    check_refs(pool, cache)
    assert pool.num_free == 5  # b's copy of the stem went back
    assert lookup(cache, stem + tail + [0], B).blocks == first + second[2:]
    assert cache.usage().private_blocks == {"a": 2, "b": 3}
    assert ask(cache, A, stem + tail) == 8  # the tail is b's alone
    assert ask(cache, C, stem + tail) == 0


def test_splitting_a_node_keeps_its_owners_senders_and_publicity():
    pool, cache, _ = make(k=3)
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=A)  # one node of three blocks
    assert ask(cache, B, PROMPT[:8]) == 0  # splits it after two blocks; b sent only those
    assert cache.usage().private_blocks == {"a": 3}  # a owns both parts
    assert ask(cache, C, PROMPT) == 8  # the third sender of the first two blocks (a's before the split)
    assert ask(cache, A, PROMPT) == 12
    assert cache.usage().public_blocks == 2 and cache.usage().private_blocks == {"a": 1}
    assert ask(cache, D, PROMPT) == 12  # the third sender of the last block

    other = [7] * 12
    finish(pool, cache, other, pool.allocate(3), tenant=X)
    assert cache.publish(other) == 3
    assert ask(cache, Y, other[:4] + [5] * 4) == 4  # splits the public node after one block
    assert ask(cache, Z, other) == 12
    assert cache.usage().public_blocks == 6
    check_refs(pool, cache)


def eviction_survivor(seconds_between: float) -> str:
    """Two prompts cached together; `old` read three times at once, `new` once `seconds_between`
    later (half-life 60 s); which one a one-node eviction leaves."""
    pool, cache, clock = make(half_life_s=60.0)
    old, new = [1] * 8, [2] * 8
    finish(pool, cache, old, pool.allocate(2), tenant=A)
    finish(pool, cache, new, pool.allocate(2), tenant=A)
    for _ in range(3):
        ask(cache, A, old)
    clock.now = seconds_between
    ask(cache, A, new)
    assert cache.evict(1) == 2
    return "old" if ask(cache, A, old) else "new"


def test_decayed_hit_counts_decide_what_is_evicted():
    assert eviction_survivor(1.0) == "old"  # four recent hits outweigh two, though older
    assert eviction_survivor(600.0) == "new"  # ten half-lives later they weigh less than one


def test_cache_usage_counts_blocks_by_holder_and_tenant():
    pool, cache, _ = make(k=5, num_blocks=16)
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=A)
    finish(pool, cache, [9] * 8, pool.allocate(2), tenant=B)
    cache.publish([9] * 8)
    hit = lookup(cache, PROMPT + [0], A)
    cache.lock(hit.node)
    pool.retain(hit.blocks)
    usage = cache.usage()
    assert usage.free_blocks == 11
    assert (usage.cached_blocks, usage.locked_blocks, usage.evictable_blocks) == (5, 3, 2)
    assert (usage.public_blocks, usage.private_blocks) == (2, {"a": 3})
    assert (usage.hit_tokens, usage.queried_tokens) == (12, 13)
    assert cache.stats() == (5, 2, 12, 13)
    cache.unlock(hit.node)
    pool.release(hit.blocks)


def test_disabled_cache_publishes_nothing():
    pool = BlockPool(8)
    cache = RadixCache(pool, BS, enabled=False)
    assert cache.publish(PROMPT) == 0
    assert cache.usage() == (8, 0, 0, 0, 0, {}, 0, 0)


@pytest.mark.parametrize("settings", [{"min_tenants": 0}, {"window_s": 0.0}])
def test_tenancy_policy_rejects_meaningless_settings(settings):
    with pytest.raises(ValueError):
        TenancyPolicy(**settings)


def test_cache_rejects_a_half_life_that_is_not_positive():
    with pytest.raises(ValueError):
        RadixCache(BlockPool(8), BS, hit_half_life_s=0.0)


def test_a_salted_tenant_reads_only_what_the_same_salt_stored():
    """`cache_salt` narrows a tenant further: its requests read no public prefix and no prefix of
    another salt (or of none), and their sends make nothing public."""
    pool, cache, _ = make(k=2)
    salted, resalted, other_salt = (
        Tenant("a", cache_salt="s1"),
        Tenant("a", cache_salt="s1"),
        Tenant("a", cache_salt="s2"),
    )
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=A)
    assert ask(cache, salted, PROMPT) == 0  # the unsalted tenant's own prefix
    finish(pool, cache, PROMPT, pool.allocate(3), tenant=salted)
    assert ask(cache, resalted, PROMPT) == 12
    assert ask(cache, other_salt, PROMPT) == 0 and ask(cache, A, PROMPT) == 12
    assert not cache.usage().public_blocks
    cache.publish(PROMPT)
    assert ask(cache, B, PROMPT) == 12 and ask(cache, other_salt, PROMPT) == 0
    assert ask(cache, salted, PROMPT) == 12  # it stored the same tokens itself

    policy, node = TenancyPolicy(min_tenants=2, window_s=10.0), Visibility()
    assert not policy.sent(node, Tenant("x", cache_salt="s"), now=0.0)
    assert not policy.sent(node, Tenant("y", cache_salt="s"), now=1.0)
    assert node.senders == {} and not node.public
