"""Host slots that a sent LoadBlocks reads (host_tier.py, kv_manager.py, batching.py), bus-free, in
the order the scheduler meets the messages: no fetch from disk, save, eviction or flush hands such a
slot out before the executor reports the load made, since the cache_tier would write it from
another process under the load; a report of another scheduler's moves unpins nothing, and a new
executor's books hold no pin (the old one's copies stopped with it)."""

from actors.scheduler.batching import ContinuousBatcher
from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.kv_manager import KVManager
from actors.scheduler.sequence import Sequence
from schemas.cache import BlocksSpilled, FetchBlocks, SpillBlocks
from schemas.generate import SamplingParams
from schemas.step import LoadBlocks, StepOutput

BS = 4
SLOTS = 4


def sequence(name: str, prompt: list[int]) -> Sequence:
    return Sequence(name, list(prompt), SamplingParams(max_tokens=8), "origin", 0)


def tiered_kv() -> KVManager:
    return KVManager(16, BS, True, TenancyPolicy(), host_slots=SLOTS, fingerprint="m", disk_segment="kvhost-x")


def host_hit(kv: KVManager) -> tuple[LoadBlocks, Sequence]:
    """A prompt of three whole blocks computed and saved to the host, gone from the GPU, then
    started again: the load of its blocks, sent and not yet made, and the sequence that reads them."""
    first = sequence("first", list(range(13)))
    assert kv.start(first)
    first.start_run(0)
    first.prefill_done = first.computed_len = 13
    kv.release(first)
    (save,) = kv.take_commands()
    kv.saved(save.slots, [])
    return start_again(kv)


def start_again(kv: KVManager) -> tuple[LoadBlocks, Sequence]:
    kv.flush()  # the GPU's copy goes; the host's stays
    again = sequence("again", list(range(13)) + [7])
    assert kv.start(again)
    (load,) = kv.take_commands()
    assert isinstance(load, LoadBlocks) and load.slots == [0, 1, 2]
    return load, again


def fetch_for(kv: KVManager, prompt: list[int]) -> FetchBlocks:
    """The fetch from disk a request of `prompt` (whole blocks the GPU and the host lack) asks;
    the host's blocks, spilled meanwhile, are on disk."""
    assert kv.waits_for_disk(sequence("fetcher", prompt))
    requests = kv.disk.take_requests()
    for _, spill in requests:
        if isinstance(spill, SpillBlocks):
            kv.disk.replied(None, spill, BlocksSpilled(spill.hashes))
    (fetch,) = [request for _, request in requests if isinstance(request, FetchBlocks)]
    return fetch


def test_a_slot_a_sent_load_reads_goes_to_no_fetch_or_save_until_the_load_is_made():
    kv = tiered_kv()
    load, _ = host_hit(kv)
    fetch = fetch_for(kv, list(range(50, 67)))  # four blocks wanted: every slot
    assert fetch.slots == [3]  # the free one alone: a shorter hit, never the loaded slots
    saves = kv.host.to_save([b"x" * 16], [9], list(range(100, 104)), b"r" * 16)
    assert saves == ([], [])  # no slot to save into either
    kv.loaded(load.slots)  # the executor's StepOutput.loaded_slots
    assert kv.host.reserve(SLOTS) == [0, 1, 2]  # read now: evicted, least recently used first


def test_a_host_flush_frees_a_slot_a_load_reads_once_the_load_is_made():
    kv = tiered_kv()
    load, _ = host_hit(kv)
    assert kv.flush_host() == 3
    assert kv.host.reserve(SLOTS) == [3]  # the flushed slots wait for their load
    kv.loaded(load.slots[:2])
    assert kv.host.reserve(SLOTS) == [0, 1]
    kv.new_generation()  # new weights drop the books again: the pin holds through it
    kv.loaded(load.slots[2:])
    assert kv.host.reserve(SLOTS) == [2]


def test_a_slot_loaded_twice_is_pinned_until_both_loads_are_made_and_unknown_reports_are_ignored():
    kv = tiered_kv()
    first, reader = host_hit(kv)
    kv.release(reader)  # it ends, and its blocks leave the GPU again, before its load is even made
    second, _ = start_again(kv)
    kv.loaded([3, 3] + first.slots)  # slot 3 had no load sent: ignored
    assert kv.host.reserve(SLOTS) == [3]
    kv.loaded(second.slots)
    assert kv.host.reserve(SLOTS) == [0, 1, 2]


def batcher_with_a_host_hit() -> tuple[ContinuousBatcher, LoadBlocks]:
    batcher = ContinuousBatcher(16, BS, 64, 100, host_slots=SLOTS, kv_fingerprint="m", disk_segment="kvhost-x")
    load, _ = host_hit(batcher.kv)
    return batcher, load


def test_the_executors_report_of_the_load_in_its_step_output_unpins_the_slots():
    batcher, load = batcher_with_a_host_hit()
    batcher.on_step(StepOutput("executor", 1, [], loaded_slots=load.slots))
    assert batcher.kv.host.reserve(SLOTS) == [3, 0, 1, 2]


def test_another_schedulers_report_unpins_nothing_and_a_new_executor_releases_the_pins():
    batcher, load = batcher_with_a_host_hit()
    batcher.on_step(StepOutput("executor", 1, [], loaded_slots=load.slots), own_moves=False)
    assert batcher.kv.host.reserve(SLOTS) == [3]  # for the disk tier to fill
    # The executor died before it made the load: its copies stopped, and the new one's books own
    # the slots, but the one the disk tier is filling until it answers.
    batcher.reset_executor(16, BS, 64, 100, SLOTS, "m", "kvhost-x")
    assert batcher.kv.host.reserve(SLOTS) == [0, 1, 2]
