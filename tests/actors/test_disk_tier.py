"""The disk tier's books (disk_tier.py, host_tier.py), bus-free: every indexed host block is spilled,
oldest first, and evicted only once the disk tier had it; a request whose prefix the disk may hold
waits for its fetch, which lands in host slots the admission then loads, and once the disk's blocks
are listed only a prompt the disk can continue waits; slots the disk tier is moving stay out of use
until it answers or restarts."""

import time

from actors.scheduler import disk_tier
from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.host_tier import HostTier
from actors.scheduler.kv_manager import KVManager
from actors.scheduler.sequence import Sequence
from actors.scheduler.tier_figures import cache_report
from schemas.cache import (
    BlocksFetched,
    BlocksListed,
    BlocksSpilled,
    DiskFigures,
    FetchBlocks,
    ListBlocks,
    SpillBlocks,
)
from schemas.errors import Error
from schemas.generate import SamplingParams
from schemas.step import LoadBlocks

BS = 4


def sequence(name: str, prompt: list[int]) -> Sequence:
    return Sequence(name, list(prompt), SamplingParams(max_tokens=8), "origin", 0)


def moves(kv: KVManager) -> list:
    """The disk tier's requests but the listing of its blocks, which is asked first and unanswered here."""
    return [(rid, request) for rid, request in kv.disk.take_requests() if not isinstance(request, ListBlocks)]


def test_indexed_blocks_are_spilled_oldest_first_and_not_evicted_while_read():
    host = HostTier(2, BS, "m", disk=True)
    seq = sequence("s", list(range(12)))
    hashes = host.hashes(seq, seq.prompt_ids, 2)
    host.to_save(hashes, [5, 6], seq.prompt_ids, host.root(seq))
    host.saved([0, 1])
    assert host.unspilled == 2
    other = host.hashes(sequence("t", list(range(50, 62))), list(range(50, 62)), 1)
    spills = host.take_spill(8)
    assert [(s.slot, s.block_hash, s.token_ids) for s in spills] == [
        (0, hashes[0], [0, 1, 2, 3]),
        (1, hashes[1], [4, 5, 6, 7]),
    ]
    assert spills[0].parent == host.root(seq) and spills[1].parent == hashes[0]
    assert host.to_save(other, [7], list(range(50, 54)), b"r" * 16) == ([], [])  # spilling: still in use
    host.spilled([0, 1])
    assert host.unspilled == 0
    assert host.to_save(other, [7], list(range(50, 54)), b"r" * 16) == ([7], [0])  # the oldest makes room
    assert host.match(hashes) == []


def test_a_busy_host_evicts_blocks_the_disk_has_not_had_and_never_writes_them():
    host = HostTier(1, BS, "m", disk=True)
    first, second = sequence("s", list(range(5))), sequence("t", list(range(50, 55)))
    host.to_save(host.hashes(first, first.prompt_ids, 1), [3], first.prompt_ids, host.root(first))
    host.saved([0])
    later = host.hashes(second, second.prompt_ids, 1)
    assert host.to_save(later, [4], second.prompt_ids, host.root(second)) == ([4], [0])
    host.saved([0])
    assert [s.block_hash for s in host.take_spill(8)] == later


def test_a_request_waits_for_its_fetch_and_then_loads_from_the_host():
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=4, fingerprint="m", disk_segment="kvhost-x")
    seq = sequence("s", list(range(13)))  # three whole blocks matchable
    assert kv.waits_for_disk(seq)
    ((request_id, fetch),) = moves(kv)
    assert request_id == "s" and isinstance(fetch, FetchBlocks) and len(fetch.hashes) == 3
    assert fetch.hashes == kv.host.hashes(seq, seq.prompt_ids, 3) and fetch.segment == "kvhost-x"
    assert kv.waits_for_disk(seq)  # until the answer
    kv.disk.replied(request_id, fetch, BlocksFetched(2))  # the third failed its check: a shorter hit
    assert not kv.waits_for_disk(seq)  # asked once
    assert kv.start(seq)
    (load,) = [c for c in kv.take_commands() if isinstance(c, LoadBlocks)]
    assert load.slots == fetch.slots[:2] and seq.cached.num_tokens == 2 * BS
    assert kv.host.stats()[1:] == (2, 0)  # indexed, pending: the slot of the block that did not come is free again


def pieced_kv(monkeypatch) -> KVManager:
    """Books over 16 pool blocks and 8 host slots whose fetches come in pieces of two blocks."""
    monkeypatch.setattr(disk_tier, "FETCH_PIECE_BLOCKS", 2)
    return KVManager(16, BS, True, TenancyPolicy(), host_slots=8, fingerprint="m", disk_segment="kvhost-x")


def test_a_fetch_comes_in_pieces_each_loaded_to_the_gpu_while_the_next_is_read(monkeypatch):
    kv = pieced_kv(monkeypatch)
    seq = sequence("s", list(range(21)))  # five whole blocks matchable
    assert kv.waits_for_disk(seq)
    pieces = moves(kv)
    assert [rid for rid, _ in pieces] == ["s"] * 3 and [len(f.hashes) for _, f in pieces] == [2, 2, 1]
    assert [h for _, f in pieces for h in f.hashes] == kv.host.hashes(seq, seq.prompt_ids, 5)
    loads = []
    for rid, piece in pieces[:2]:
        kv.disk.replied(rid, piece, BlocksFetched(len(piece.hashes)))
        assert kv.waits_for_disk(seq)  # the next piece is still to come, and this one goes to the GPU
        (load,) = kv.take_commands()
        assert isinstance(load, LoadBlocks) and load.slots == piece.slots
        loads.append(load)
    assert kv.cache.match(seq.prompt_ids, seq.tenant).num_tokens == 4 * BS  # in the tree, ahead of the start
    rid, last = pieces[2]
    kv.disk.replied(rid, last, BlocksFetched(1))
    assert not kv.waits_for_disk(seq)
    assert kv.start(seq)
    (load,) = [c for c in kv.take_commands() if isinstance(c, LoadBlocks)]
    assert load.slots == last.slots  # the last piece alone loads with the start
    assert seq.blocks[:5] == loads[0].blocks + loads[1].blocks + load.blocks
    tiers = cache_report(kv, [seq]).tiers
    assert {name: t.hits for name, t in tiers.items()} == {"gpu": 0, "host": 0, "disk": 5}


def test_a_short_piece_ends_the_wait_with_the_blocks_before_it(monkeypatch):
    kv = pieced_kv(monkeypatch)
    seq = sequence("s", list(range(21)))
    assert kv.waits_for_disk(seq)
    (first, second, third) = moves(kv)
    kv.disk.replied(*first, BlocksFetched(1))  # the second block failed its check
    assert not kv.waits_for_disk(seq)
    assert kv.start(seq) and seq.cached.num_tokens == BS
    kv.disk.replied(*second, BlocksFetched(2))  # read all the same: indexed for later, nobody waits
    kv.disk.replied(*third, BlocksFetched(1))
    assert kv.host.stats()[1:] == (4, 0)


def test_pieces_that_land_for_a_new_executors_books_load_into_its_pool(monkeypatch):
    """An executor that restarts while a fetch's pieces are read: the new books take the fetch over,
    what the old pool held counts for nothing, and the next piece loads into the new pool."""
    old = pieced_kv(monkeypatch)
    seq = sequence("s", list(range(21)))
    assert old.waits_for_disk(seq)
    first, second, third = moves(old)
    old.disk.replied(*first, BlocksFetched(2))
    assert old.waits_for_disk(seq) and seq.prefetched == 2
    new = pieced_kv(monkeypatch)
    new.disk.carry_over(old.disk)
    assert seq.prefetched == 0  # that pool is gone
    new.disk.replied(*second, BlocksFetched(2))  # lands in slots the new books keep out of use
    assert new.waits_for_disk(seq)
    new.disk.replied(*third, BlocksFetched(1))
    assert not new.waits_for_disk(seq)
    assert new.start(seq)
    assert seq.cached.num_tokens == 0  # the new books never indexed the first piece: it went with the old
    assert new.host.stats().pending == 0


def test_a_request_that_goes_while_its_pieces_are_read_leaves_them_to_the_cache(monkeypatch):
    kv = pieced_kv(monkeypatch)
    seq = sequence("s", list(range(21)))
    assert kv.waits_for_disk(seq)
    first, second, third = moves(kv)
    kv.disk.replied(*first, BlocksFetched(2))
    assert kv.waits_for_disk(seq)
    kv.take_commands()
    assert kv.disk.deadline_passed("s")  # an abort, or the deadline: it waits no more
    kv.disk.replied(*second, BlocksFetched(2))
    kv.disk.replied(*third, BlocksFetched(1))
    later = sequence("t", list(range(21)))
    assert not kv.waits_for_disk(later)  # the host holds what the disk held: nothing to fetch
    assert kv.start(later)
    assert later.cached.num_tokens == 5 * BS  # two blocks in the tree already, three loaded from the host
    assert kv.cache.stats().cached_blocks == 5


def test_blocks_fetched_for_a_request_are_the_disks_hits_and_its_figures_the_last_it_gave():
    kv = KVManager(8, BS, True, TenancyPolicy(), 4, "m", "kvhost-x", block_bytes=100)
    seq = sequence("s", list(range(13)))  # three whole blocks matchable
    assert kv.waits_for_disk(seq)
    ((request_id, fetch),) = moves(kv)
    kv.disk.replied(request_id, fetch, BlocksFetched(2, DiskFigures(5, 600, 1000)))
    assert kv.start(seq)
    tiers = cache_report(kv, [seq]).tiers
    assert {name: (t.hits, t.lookups) for name, t in tiers.items()} == {"gpu": (0, 3), "host": (0, 3), "disk": (2, 3)}
    assert (tiers["host"].blocks, tiers["host"].bytes, tiers["host"].capacity_bytes) == (2, 200, 400)
    disk = tiers["disk"]
    assert (disk.blocks, disk.bytes, disk.capacity_bytes, disk.hit_rate) == (5, 600, 1000, 2 / 3)
    assert disk.capacity_blocks == 10  # 1000 bytes of 100-byte blocks


def test_after_a_flush_of_the_disk_nothing_is_listed_and_the_disk_is_listed_again():
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=4, fingerprint="m", disk_segment="kvhost-x")
    ((_, listing),) = kv.disk.take_requests()
    seq = sequence("s", list(range(13)))
    kv.disk.replied(None, listing, BlocksListed(kv.host.hashes(seq, seq.prompt_ids, 3), DiskFigures(3, 300, 1000)))
    kv.disk.flushed()
    assert kv.disk.figures() == DiskFigures(0, 0, 1000)
    assert kv.disk.take_requests() == [(None, listing)]  # listed again
    kv.disk.replied(None, listing, BlocksListed([]))
    assert not kv.waits_for_disk(seq)  # the disk holds none of it now: admitted at once


def test_slots_of_an_unanswered_move_stay_out_of_use_until_the_disk_tier_restarts():
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=2, fingerprint="m", disk_segment="kvhost-x")
    seq = sequence("s", list(range(9)))
    assert kv.waits_for_disk(seq)
    ((request_id, fetch),) = moves(kv)
    kv.disk.replied(request_id, fetch, Error("timeout", "no answer", retriable=True))
    assert not seq.fetching and kv.host.stats().pending == 2  # it goes on; the slots stay taken
    kv.disk.restarted()
    assert kv.host.stats().pending == 0


def test_a_spill_the_disk_refused_still_frees_its_slots_for_eviction():
    host = HostTier(1, BS, "m", disk=True)
    seq = sequence("s", list(range(5)))
    hashes = host.hashes(seq, seq.prompt_ids, 1)
    host.to_save(hashes, [3], seq.prompt_ids, host.root(seq))
    host.saved([0])
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=1, fingerprint="m", disk_segment="kvhost-x")
    kv.host = kv.disk.host = host
    ((_, spill),) = moves(kv)
    assert isinstance(spill, SpillBlocks) and spill.hashes == hashes
    kv.disk.replied(None, spill, BlocksSpilled([]))  # the disk was full
    assert host.take_spill(8) == []
    assert host.to_save([b"x" * 16], [4], list(range(4)), b"r" * 16) == ([4], [0])


def test_once_the_disk_is_listed_only_a_prompt_it_continues_waits_and_only_for_what_it_holds():
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=4, fingerprint="m", disk_segment="kvhost-x")
    ((_, listing),) = kv.disk.take_requests()
    assert listing == ListBlocks("kvhost-x", kv.host.key)
    assert kv.disk.take_requests() == []  # asked once
    held, new = sequence("s", list(range(13))), sequence("t", list(range(50, 63)))
    kv.disk.replied(None, listing, BlocksListed(kv.host.hashes(held, held.prompt_ids, 3)[:2]))
    assert not kv.waits_for_disk(new)  # the disk holds none of it: admitted at once
    assert kv.waits_for_disk(held)
    ((_, fetch),) = kv.disk.take_requests()
    assert fetch.hashes == kv.host.hashes(held, held.prompt_ids, 3)[:2]  # not the third: not on disk


def test_a_listing_that_failed_is_asked_again(monkeypatch):
    monkeypatch.setattr(disk_tier, "LIST_RETRY_S", 0.0)
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=4, fingerprint="m", disk_segment="kvhost-x")
    ((_, listing),) = kv.disk.take_requests()
    kv.disk.replied(None, listing, Error("unavailable", "no cache_tier yet", retriable=True))
    assert kv.waits_for_disk(sequence("s", list(range(13))))  # meanwhile every prompt asks
    assert any(isinstance(request, ListBlocks) for _, request in kv.disk.take_requests())


def test_no_spill_is_sent_while_a_request_waits_for_its_fetch():
    """The disk tier answers one request at a time: a spill sent now would hold the fetch up."""
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=4, fingerprint="m", disk_segment="kvhost-x")
    writer = sequence("w", list(range(100, 109)))
    kv.host.to_save(kv.host.hashes(writer, writer.prompt_ids, 2), [5, 6], writer.prompt_ids, kv.host.root(writer))
    kv.host.saved([0, 1])  # two host blocks the disk has not had
    seq = sequence("s", list(range(13)))
    assert kv.waits_for_disk(seq)
    ((request_id, fetch),) = moves(kv)
    assert isinstance(fetch, FetchBlocks) and moves(kv) == []  # the spill waits
    kv.disk.replied(request_id, fetch, BlocksFetched(0))
    ((_, spill),) = moves(kv)
    assert isinstance(spill, SpillBlocks)


def test_fetches_hold_the_spills_no_longer_than_spill_hold_s(monkeypatch):
    monkeypatch.setattr(disk_tier, "SPILL_HOLD_S", 0.05)
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=4, fingerprint="m", disk_segment="kvhost-x")
    writer = sequence("w", list(range(100, 109)))
    kv.host.to_save(kv.host.hashes(writer, writer.prompt_ids, 2), [5, 6], writer.prompt_ids, kv.host.root(writer))
    kv.host.saved([0, 1])
    assert kv.waits_for_disk(sequence("s", list(range(13))))
    assert [type(r) for _, r in moves(kv)] == [FetchBlocks]  # unanswered from here on
    time.sleep(0.06)
    assert [type(r) for _, r in moves(kv)] == [SpillBlocks]


def first_page_answered() -> tuple[KVManager, Sequence, list[bytes], ListBlocks]:
    """A disk tier whose listing's first page (of two) came back with the first of a prompt's three
    blocks: the books, the prompt, its blocks' hashes and the second page's request."""
    kv = KVManager(8, BS, True, TenancyPolicy(), host_slots=8, fingerprint="m", disk_segment="kvhost-x")
    ((_, first),) = kv.disk.take_requests()
    seq = sequence("s", list(range(13)))
    hashes = kv.host.hashes(seq, seq.prompt_ids, 3)
    kv.disk.replied(None, first, BlocksListed(hashes[:1], next_start=1))
    ((_, second),) = kv.disk.take_requests()
    return kv, seq, hashes, second


def test_a_listing_in_pages_is_known_once_its_last_page_comes_with_the_spills_between():
    kv, seq, hashes, second = first_page_answered()
    assert second == ListBlocks("kvhost-x", kv.host.key, start=1)
    assert kv.waits_for_disk(seq)  # not known yet: every prompt asks
    kv.disk.replied(None, SpillBlocks("kvhost-x", kv.host.key, [], [], [], []), BlocksSpilled([hashes[2]]))
    kv.disk.take_requests()  # the first prompt's fetch
    kv.disk.replied(None, second, BlocksListed(hashes[1:2]))
    assert not kv.waits_for_disk(sequence("t", list(range(50, 63))))  # listed: a new prompt goes at once
    again = sequence("s2", list(range(13)))
    assert kv.waits_for_disk(again)
    ((_, fetch),) = kv.disk.take_requests()
    assert fetch.hashes == hashes  # both pages, and what a spill stored meanwhile


def test_a_page_of_a_listing_a_flush_gave_up_is_ignored_and_the_disk_listed_anew():
    kv, seq, hashes, second = first_page_answered()
    kv.disk.flushed()
    kv.disk.replied(None, second, BlocksListed(hashes[1:2]))  # the page asked before the flush
    ((_, again),) = kv.disk.take_requests()
    assert again == ListBlocks("kvhost-x", kv.host.key)  # from the start
    assert kv.waits_for_disk(seq)  # nothing is taken for listed until that listing ends
