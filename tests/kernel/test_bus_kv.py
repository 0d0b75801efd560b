"""A JetStream key-value bucket as the actors use it (kernel/bus_kv.py), on a real nats-server: its
listing of keys names every key that had a value when it began, while other clients write."""

import asyncio

import pytest

from kernel.bus import Bus


@pytest.fixture
async def bus(nats_url):
    connected = await Bus.connect(nats_url, "snapshot")
    yield connected
    await connected.close()


async def test_the_listing_names_every_key_with_a_value_and_deleted_ones_until_their_markers_go(bus):
    bucket = await bus.key_value("listing-deletes")
    for key in ("a", "b.c", "d_e"):
        await bucket.put(key, b"x")
    await bucket.delete("a")
    assert sorted(await bucket.keys()) == ["a", "b.c", "d_e"]  # "a": its delete marker
    assert await bucket.get("a") is None
    await bucket.drop_delete_markers(older_than_s=0)
    assert sorted(await bucket.keys()) == ["b.c", "d_e"]
    await bucket.delete("b.c")
    await bucket.delete("d_e")
    await bucket.drop_delete_markers(older_than_s=0)
    assert await bucket.keys() == []


async def test_no_key_is_left_out_while_another_client_writes(bus, nats_url):
    bucket = await bus.key_value("listing-writes")
    before = [f"k{i}" for i in range(400)]
    await asyncio.gather(*(bucket.put(key, b"v") for key in before))
    writer_bus = await Bus.connect(nats_url, "snapshot")
    writer = await writer_bus.key_value("listing-writes")
    writing = True

    async def write() -> None:
        i = 0
        while writing:  # new keys and new values of the old ones, as other servers' snapshots do
            await asyncio.gather(writer.put(f"new{i}", b"v"), writer.put(before[i % len(before)], b"w"))
            i += 1

    task = asyncio.create_task(write())
    try:
        for _ in range(5):
            listed = set(await bucket.keys())
            assert listed.issuperset(before), sorted(set(before) - listed)[:5]
    finally:
        writing = False
        await task
        await writer_bus.close()
