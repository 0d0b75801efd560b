"""The host tier's shared-memory segment (actors/cache_tier/host_segment.py): slots written in one
process are read in another, the segment outlives the process that made it (so a cache_tier that
restarts finds its blocks), and its table says which block each slot holds."""

import os
import subprocess
import sys
import textwrap
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from actors.cache_tier.host_segment import ALIGN, SHM_DIR, HostSegment, NoRoom

REPO = Path(__file__).parents[2]
HASH_A, HASH_B = bytes(range(16)), bytes(range(16, 32))


@pytest.fixture
def name():
    name = f"test-host-segment-{uuid.uuid4().hex[:12]}"
    yield name
    (SHM_DIR / name).unlink(missing_ok=True)


def in_child(code: str) -> str:
    """`code` run by a fresh Python process of this repository; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "leaked shared_memory" not in done.stderr  # no resource tracker took the segment on
    return done.stdout


def test_a_segment_outlives_the_process_that_made_it(name):
    in_child(f"""
        from actors.cache_tier.host_segment import HostSegment
        segment = HostSegment.create("{name}", 4, 10000)
        slots = segment.slots()
        for slot in range(4):
            slots[slot] = slot + 1
        segment.record(1, {HASH_A!r})
        segment.record(3, {HASH_B!r})
    """)
    assert (SHM_DIR / name).exists()
    read = in_child(f"""
        from actors.cache_tier.host_segment import HostSegment
        segment = HostSegment.attach("{name}")
        slots = segment.slots()
        print(segment.num_slots, segment.slot_bytes, [int(slots[s].sum()) for s in range(4)])
        print(sorted(segment.recorded().items()))
    """)
    assert read.splitlines() == [
        f"4 10000 {[10000 * k for k in (1, 2, 3, 4)]}",
        str([(1, HASH_A), (3, HASH_B)]),
    ]
    reopened = HostSegment.create(name, 4, 10000)  # the same geometry: the blocks are kept
    assert (reopened.slots()[2] == 3).all() and reopened.recorded() == {1: HASH_A, 3: HASH_B}
    reopened.close()


def test_writes_through_one_mapping_are_seen_through_another(name):
    made = HostSegment.create(name, 3, 5000)
    attached = HostSegment.attach(name)
    made.slots()[2, :7] = np.arange(7, dtype=np.uint8)
    made.record(2, HASH_A)
    assert attached.slots()[2, :7].tolist() == list(range(7))
    assert attached.recorded() == {2: HASH_A}
    attached.slots()[0, -1] = 200
    assert made.slots()[0, -1] == 200
    made.close()
    attached.close()


def test_slots_start_on_page_boundaries_as_a_zero_copy_view(name):
    segment = HostSegment.create(name, 5, 5000)  # not a multiple of 4096: rows are 8192 apart
    slots = segment.slots()
    assert slots.shape == (5, 5000) and slots.dtype == np.uint8
    assert segment.slot_stride == 8192 and slots.strides == (8192, 1)
    assert all(slots[s].ctypes.data % ALIGN == 0 for s in range(5))
    assert slots.ctypes.data == segment.slots().ctypes.data  # the same memory every time
    segment.close()


def test_another_geometry_replaces_the_segment(name):
    old = HostSegment.create(name, 2, 4096)
    old.slots().fill(9)
    old.record(0, HASH_A)
    new = HostSegment.create(name, 3, 4096)
    assert (new.num_slots, new.slot_bytes) == (3, 4096)
    assert new.recorded() == {} and (new.slots() == 0).all()
    assert (old.slots() == 9).all()  # the old mapping stays valid for whoever holds it
    assert HostSegment.attach(name).num_slots == 3
    old.close()
    new.close()


def test_the_table_records_and_forgets_block_hashes(name):
    segment = HostSegment.create(name, 4, 4096)
    assert segment.recorded() == {}
    segment.record(0, HASH_A)
    segment.record(3, HASH_B)
    segment.record(0, HASH_B)
    assert segment.recorded() == {0: HASH_B, 3: HASH_B}
    segment.record(3, None)
    assert segment.recorded() == {0: HASH_B}
    with pytest.raises(ValueError, match="slot"):
        segment.record(4, HASH_A)
    with pytest.raises(ValueError, match="block_hash"):
        segment.record(1, b"short")
    segment.close()
    with pytest.raises(ValueError, match="closed"):
        segment.recorded()


@pytest.mark.parametrize(
    "num_slots, slot_bytes, field",
    [(0, 4096, "num_slots"), (-1, 4096, "num_slots"), (4, 0, "slot_bytes"), (4, -8, "slot_bytes")],
)
def test_sizes_of_nothing_are_refused(name, num_slots, slot_bytes, field):
    with pytest.raises(ValueError, match=field):
        HostSegment.create(name, num_slots, slot_bytes)
    assert not (SHM_DIR / name).exists()


def test_a_segment_larger_than_the_free_shared_memory_is_refused(name):
    stats = os.statvfs(SHM_DIR)
    too_many = stats.f_bavail * stats.f_frsize // (1 << 20) + 1
    with pytest.raises(NoRoom, match="slots of 1048576 bytes need"):
        HostSegment.create(name, too_many, 1 << 20)
    assert not list(SHM_DIR.glob(f"*{name}*"))


def test_what_is_not_a_segment_is_refused_by_attach_and_replaced_by_create(name):
    with pytest.raises(FileNotFoundError, match="name"):
        HostSegment.attach(name)
    (SHM_DIR / name).write_bytes(b"not a segment" * 1000)
    with pytest.raises(ValueError, match="not a host segment"):
        HostSegment.attach(name)
    segment = HostSegment.create(name, 2, 4096)
    assert segment.recorded() == {} and HostSegment.attach(name).num_slots == 2
    segment.close()
    with pytest.raises(ValueError, match="name"):
        HostSegment.create("../etc", 2, 4096)


def test_a_half_made_segment_of_a_dead_creator_is_removed(name):
    left = SHM_DIR / f".{name}.999999999.building"  # no process has this id
    left.write_bytes(b"\0" * 4096)
    HostSegment.create(name, 1, 4096).close()
    assert not left.exists()


def test_closing_keeps_the_memory_of_live_slot_arrays(name):
    segment = HostSegment.create(name, 2, 4096)
    slots = segment.slots()
    slots[1] = 5
    segment.close()
    segment.unlink()
    assert not (SHM_DIR / name).exists()
    assert (slots[1] == 5).all()  # still mapped: unmapped when the last array goes


def resident_bytes(address: int) -> int:
    """This process's resident bytes (pages in its page tables) of the mapping holding `address`."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        span = line.split()[0]
        if "-" in span and all(c in "0123456789abcdef-" for c in span):
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end:
                rss = next(entry for entry in lines[i + 1 :] if entry.startswith("Rss:"))
                return int(rss.split()[1]) * 1024
    raise LookupError(f"no mapping holds {address:#x}")


def test_prefault_maps_every_slot_page_into_this_process(name):
    made = HostSegment.create(name, 64, 65536)
    made.slots()[:] = 7  # the executor's side: the pages exist
    attached = HostSegment.attach(name)  # a restarted cache_tier's mapping: no page touched yet
    slots = attached.slots()
    slots_bytes = 64 * attached.slot_stride
    assert resident_bytes(slots.ctypes.data) < slots_bytes // 2
    with ThreadPoolExecutor(2) as pool:
        attached.prefault(pool)  # in pieces, on the cache_tier's reader threads
    assert resident_bytes(slots.ctypes.data) >= slots_bytes
    assert (slots == 7).all()  # the same pages, not new ones
    attached.close()
    made.close()
