"""The host tier's books (host_tier.py) and the KV manager's use of them, bus-free: write-through
of cached blocks, loads of a prefix the GPU evicted, and what may never be matched."""

from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.host_tier import HostTier
from actors.scheduler.kv_manager import KVManager
from actors.scheduler.sequence import Sequence
from actors.scheduler.tier_figures import cache_report
from schemas.generate import SamplingParams
from schemas.requests import Tenant
from schemas.step import LoadBlocks, SaveBlocks

BS = 4
TOKENS, ROOT = list(range(2 * BS)), b"r" * 16  # what the blocks hold: the disk tier's concern


def sequence(name: str, prompt: list[int], tenant: Tenant = Tenant()) -> Sequence:
    return Sequence(name, list(prompt), SamplingParams(max_tokens=8), "origin", 0, tenant=tenant)


def finish(kv: KVManager, seq: Sequence) -> None:
    """The whole prompt computed, then the request ends."""
    seq.start_run(seq.cached.num_tokens)
    seq.prefill_done = seq.computed_len = len(seq.prefill_ids)
    kv.release(seq)


def confirm(kv: KVManager) -> list:
    """The executor makes every save asked so far; returns the commands it was sent."""
    commands = kv.take_commands()
    kv.saved([s for c in commands if isinstance(c, SaveBlocks) for s in c.slots], [])
    return commands


def test_slots_are_free_saving_or_indexed_and_only_indexed_ones_match():
    host = HostTier(2, BS, "model|float32")
    a, b, c = b"a" * 16, b"b" * 16, b"c" * 16
    assert host.to_save([a, b], [10, 11], TOKENS, ROOT) == ([10, 11], [0, 1])
    assert host.match([a]) == []  # saving: not whole yet
    assert host.stats() == (2, 0, 2)  # slots, blocks, pending
    assert host.to_save([c], [12], TOKENS, ROOT) == ([], [])  # every slot saving: nothing evicted
    assert host.saved([0, 1]) == [10, 11]
    assert host.match([a, b, c]) == [0, 1]
    assert host.stats() == (2, 2, 0)
    assert host.to_save([c], [12], TOKENS, ROOT) == ([12], [0])  # a, the least recently used, makes room
    assert host.match([a]) == []
    assert host.unsaved([0]) == [12] and host.stats().blocks == 1
    assert host.saved([7]) == []  # never asked of this scheduler: ignored


def test_a_flush_drops_every_block_and_what_the_disk_has_not_had_and_frees_slots_once_in_no_use():
    host = HostTier(3, BS, "m", disk=True)
    seq = sequence("s", list(range(13)))
    hashes = host.hashes(seq, seq.prompt_ids, 3)
    host.to_save(hashes[:2], [5, 6], seq.prompt_ids, host.root(seq))
    host.saved([0, 1])
    assert [s.slot for s in host.take_spill(1)] == [0]  # the disk tier reads slot 0
    host.to_save(hashes[2:], [7], seq.prompt_ids[2 * BS :], hashes[1])  # slot 2 saving
    assert host.flush() == 3
    assert host.match(hashes) == [] and host.take_spill(8) == [] and host.stats() == (3, 0, 0)
    assert host.saved([2]) == [7]  # the copy lands, and is dropped
    host.spilled([0])  # the disk tier is done with it
    assert host.reserve(3) == [1, 2, 0]  # every slot free, each once out of use


def test_new_weights_match_nothing_held_and_free_saves_when_done():
    host = HostTier(2, BS, "m")
    seq = sequence("s", list(range(9)))
    hashes = host.hashes(seq, seq.prompt_ids, 2)
    host.to_save(hashes[:1], [5], seq.prompt_ids, host.root(seq))
    host.saved([0])
    host.to_save(hashes[1:], [6], seq.prompt_ids[BS:], hashes[0])
    host.new_generation(1)
    assert host.hashes(seq, seq.prompt_ids, 2) != hashes  # a new namespace
    assert host.saved([1]) == [6] and host.match(hashes) == []
    assert host.stats()[1:] == (0, 0)  # no block, none on its way


def test_hashes_differ_by_tenant_and_extend_as_the_sequence_grows():
    host = HostTier(4, BS, "m")
    one, other = sequence("a", list(range(12))), sequence("b", list(range(12)), Tenant("t"))
    assert host.hashes(one, one.prompt_ids, 1) == host.hashes(one, one.prompt_ids, 3)[:1]
    assert host.hashes(one, one.prompt_ids, 3) != host.hashes(other, other.prompt_ids, 3)


def test_an_evicted_prefix_comes_back_from_the_host_before_its_start():
    kv = KVManager(6, BS, True, TenancyPolicy(), host_slots=8, fingerprint="m")
    first = sequence("first", list(range(13)))  # three full blocks and one token: 4 blocks
    assert kv.start(first)
    finish(kv, first)
    saves = confirm(kv)
    assert saves == [SaveBlocks(saves[0].blocks, [0, 1, 2])] and len(saves[0].blocks) == 3
    assert kv.pool.num_free == 3  # the tree holds 3; the saves' references are gone
    other = sequence("other", list(range(100, 121)))  # 6 blocks: evicts the whole cached prefix
    assert kv.start(other)
    assert kv.cache.stats().cached_blocks == 0
    kv.release(other)  # nothing computed
    assert kv.start(again := sequence("again", list(range(13)) + [7, 8]))
    (load,) = kv.take_commands()
    assert load == LoadBlocks([0, 1, 2], again.blocks[:3])
    assert again.cached.num_tokens == 12 and again.cached.blocks == again.blocks[:3]
    host = cache_report(kv, [again]).tiers["host"]
    # Each first lookup asked the host for what the GPU lacked: 3 blocks of first's, 5 of other's, 3 of again's.
    assert (host.hits, host.lookups, host.blocks, host.capacity_blocks) == (3, 3 + 5 + 3, 3, 8)


def test_a_block_being_saved_is_not_reused_until_the_save_is_done():
    kv = KVManager(4, BS, True, TenancyPolicy(), host_slots=8, fingerprint="m")
    first = sequence("first", list(range(9)))
    assert kv.start(first)
    finish(kv, first)
    (save,) = kv.take_commands()
    kv.flush()  # the tree lets go of them; the saves hold them
    assert kv.pool.num_free == 2 and all(kv.pool.ref_count(b) == 1 for b in save.blocks)
    kv.saved(save.slots, [])
    assert kv.pool.num_free == 4


def test_without_a_host_tier_nothing_is_hashed_or_sent():
    kv = KVManager(8, BS, True, TenancyPolicy())
    seq = sequence("s", list(range(9)))
    assert kv.start(seq)
    finish(kv, seq)
    assert kv.take_commands() == [] and seq.block_hashes == []
    assert list(cache_report(kv, []).tiers) == ["gpu"]


def test_after_new_weights_the_old_host_blocks_are_never_loaded():
    kv = KVManager(6, BS, True, TenancyPolicy(), host_slots=8, fingerprint="m")
    first = sequence("first", list(range(13)))
    assert kv.start(first)
    finish(kv, first)
    confirm(kv)
    kv.new_generation()  # frees the GPU's cached blocks too
    assert kv.start(again := sequence("again", list(range(13)) + [7]))
    assert kv.take_commands() == [] and again.cached.num_tokens == 0
    assert cache_report(kv, [again]).tiers["host"].blocks == 0
