"""A JetStream object bucket as the actors use it (kernel/bus_objects.py), on a real nats-server:
files of many chunks go in and come back whole and checked, the listing names what is there in the
order it was put, and a missing or damaged object is an error, never wrong bytes."""

import os

import nats
import pytest

from kernel.bus import Bus
from kernel.bus_jetstream import JetStreamError
from kernel.bus_objects import CHUNK_BYTES, ObjectMissing


@pytest.fixture
async def bus(nats_url):
    connected = await Bus.connect(nats_url, "cache_tier")
    yield connected
    await connected.close()


async def test_files_of_many_chunks_come_back_whole_and_the_listing_names_them_in_order(bus, tmp_path):
    bucket = await bus.object_bucket("chains-test", 64 << 20)
    contents = {"ns/a.kv": os.urandom(3 * CHUNK_BYTES + 123), "ns/b.kv": b"", "other/c.kv": os.urandom(10)}
    for name, data in contents.items():
        (tmp_path / "in").write_bytes(data)
        await bucket.put_file(name, tmp_path / "in", description=f"about {name}")
    for name, data in contents.items():
        await bucket.get_file(name, tmp_path / "out", timeout_s=10)
        assert (tmp_path / "out").read_bytes() == data
    listed = await bucket.objects()
    assert [(o.name, o.size, o.description) for o in listed] == [(n, len(d), f"about {n}") for n, d in contents.items()]

    await bucket.delete("ns/a.kv")
    await bucket.delete("ns/a.kv")  # gone already: nothing to do
    assert [o.name for o in await bucket.objects()] == ["ns/b.kv", "other/c.kv"]
    with pytest.raises(ObjectMissing):
        await bucket.get_file("ns/a.kv", tmp_path / "out", timeout_s=10)
    await bucket.purge()
    assert await bucket.objects() == []


async def test_a_full_bucket_refuses_a_put_and_keeps_what_it_had(bus, tmp_path):
    bucket = await bus.object_bucket("chains-full", 2 * CHUNK_BYTES)
    (tmp_path / "small").write_bytes(b"x" * 1000)
    await bucket.put_file("small", tmp_path / "small")
    (tmp_path / "large").write_bytes(os.urandom(3 * CHUNK_BYTES))
    with pytest.raises(JetStreamError):
        await bucket.put_file("large", tmp_path / "large")
    assert [o.name for o in await bucket.objects()] == ["small"]
    await bucket.get_file("small", tmp_path / "out", timeout_s=10)
    assert (tmp_path / "out").read_bytes() == b"x" * 1000


async def test_an_object_whose_bytes_are_gone_is_an_error_not_a_short_file(bus, tmp_path):
    bucket = await bus.object_bucket("chains-damaged", 64 << 20)
    (tmp_path / "in").write_bytes(os.urandom(2 * CHUNK_BYTES))
    await bucket.put_file("chain", tmp_path / "in")
    # The chunks purged behind the meta message's back: the digest no longer matches anything.
    js = bus._nc.jetstream()
    await js.purge_stream("OBJ_chains-damaged", subject="$O.chains-damaged.C.>")
    with pytest.raises(JetStreamError):
        await bucket.get_file("chain", tmp_path / "out", timeout_s=2)


async def test_the_chunks_of_a_put_cut_short_are_swept_once_old_enough(bus, nats_url, tmp_path):
    bucket = await bus.object_bucket("chains-test", 64 << 20)
    killed = await nats.connect(nats_url)  # a put killed after its chunks, before its meta message
    for _ in range(3):
        await killed.jetstream().publish("$O.chains-test.C.cutshort", os.urandom(1000))
    await killed.close()
    (tmp_path / "in").write_bytes(os.urandom(CHUNK_BYTES + 7))
    await bucket.put_file("ns/kept.kv", tmp_path / "in")  # the stream's clock goes on past them
    before = await bucket.used_bytes()
    assert await bucket.drop_orphan_chunks(older_than_s=3600) == 0  # maybe a put under way: kept
    assert await bucket.drop_orphan_chunks(older_than_s=0) == 1
    assert await bucket.used_bytes() <= before - 3000
    await bucket.get_file("ns/kept.kv", tmp_path / "out", timeout_s=10)
    assert (tmp_path / "out").read_bytes() == (tmp_path / "in").read_bytes()
