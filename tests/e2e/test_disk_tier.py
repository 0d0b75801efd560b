"""The disk tier through the whole stack: a GPU pool and a host tier both too small for the working
set, a disk tier behind them (the cache_tier actor). A prompt whose blocks left the pool and the
host is read back from disk instead of recomputed, also after the whole server restarted on the same
data dir, and draws the tokens it drew when computed from scratch; a damaged block file is detected
and recomputed, with the same tokens. A cache_tier killed while it moves blocks loses no request and
serves no damaged block; the one that replaces it takes the spills up again. A disk that fills
costs recomputes and a warning, never a request. Blocks kept under old weights are never served
under new ones."""

import asyncio
import os
import signal
import threading

import pytest

from actors.cache_tier.actor import DEFAULT_DIR
from actors.cache_tier.host_segment import remove_segments  # what a server that did not stop cleanly left
from actors.scheduler.disk_tier import FETCH_PIECE_BLOCKS
from gpu.model_builder import build_model_dir
from ops.local_server import start_server
from schemas.admin_weights import UpdateFromDisk, WeightsUpdated
from tests.e2e.tier_requests import cache_report, complete, host_segments, prompt, settle
from tests.e2e.weights_client import Reference, ask, generate
from tests.full_disk import small_tmpfs

POOL_BLOCKS = 24  # 384 tokens of 16: room for about two of the prompts below
HOST_SLOTS = 32  # and the host for not many more
FLAGS = ("--num-kv-blocks", str(POOL_BLOCKS), "--host-kv-blocks", str(HOST_SLOTS), "--disk-kv-gb", "1")
TOPICS = ("river valley farmers", "mountain railway builders", "harbour town fishermen", "desert caravan guides")


def cached_tokens(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("disk-tier")
    yield path
    remove_segments(path)


def test_blocks_gone_from_the_pool_and_the_host_come_back_from_disk_also_after_a_restart(data_dir):
    server = start_server(data_dir, *FLAGS)
    try:
        first = [complete(server, prompt(topic)) for topic in TOPICS]
        settle(server)
        again = complete(server, prompt(TOPICS[0]))  # the pool and the host both moved on
        report = cache_report(server)
        assert report["tiers"]["disk"]["hits"] > 0
        assert cached_tokens(again) >= again["usage"]["prompt_tokens"] - 16
        assert again["choices"][0]["text"] == first[0]["choices"][0]["text"]
        settle(server)
        assert host_segments(data_dir)
    finally:
        server.stop()
    assert not host_segments(data_dir)  # a stopped server leaves no memory behind it in /dev/shm

    server = start_server(data_dir, *FLAGS)  # the whole server again, on the same data dir
    try:
        after = complete(server, prompt(TOPICS[1]))
        assert cached_tokens(after) >= after["usage"]["prompt_tokens"] - 16  # nothing recomputed the disk held
        assert cache_report(server)["tiers"]["disk"]["hits"] > 0
        assert after["choices"][0]["text"] == first[1]["choices"][0]["text"]

        for chain in (data_dir / DEFAULT_DIR).rglob("*.kv"):  # a byte of every page damaged, so every block
            with chain.open("r+b") as f:
                for offset in range(4096 + 17, chain.stat().st_size, 4096):
                    f.seek(offset)
                    f.write(b"\xff")
        damaged = complete(server, prompt(TOPICS[2]))
        assert cached_tokens(damaged) < damaged["usage"]["prompt_tokens"] // 2  # recomputed, not read
        assert damaged["choices"][0]["text"] == first[2]["choices"][0]["text"]
    finally:
        server.stop()


def test_a_prefix_read_back_in_several_pieces_draws_the_tokens_it_drew_when_computed(tmp_path):
    """Blocks of one token, so that a prompt's prefix is several of the disk tier's fetch pieces:
    after a restart each piece goes to the pool while the next is read, and the prompt computes
    nothing the disk held."""
    flags = ("--block-size", "1", "--num-kv-blocks", "1500", "--host-kv-blocks", "1500", "--disk-kv-gb", "1")
    text = prompt(TOPICS[3]) * 3
    server = start_server(tmp_path / "data", *flags)
    try:
        first = complete(server, text)
        assert first["usage"]["prompt_tokens"] > 2 * FETCH_PIECE_BLOCKS
        settle(server)
    finally:
        server.stop()
    server = start_server(tmp_path / "data", *flags)
    try:
        again = complete(server, text)
        assert cached_tokens(again) == again["usage"]["prompt_tokens"] - 1  # all but the last token, from disk
        assert cache_report(server)["tiers"]["disk"]["hits"] == cached_tokens(again)
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
    finally:
        server.stop()
        remove_segments(tmp_path / "data")


def test_a_killed_cache_tier_loses_no_request_and_its_successor_spills_on(tmp_path):
    """Requests run at once while the cache_tier is killed: every one ends whole. (Their tokens are
    not compared with the ones computed alone: prompts batched together may round otherwise on the
    CPU, and a random model's near-ties follow.) The cache_tier that replaces it writes what was left
    to write, and serves prompts back with the tokens they drew when computed alone."""
    server = start_server(tmp_path / "data", *FLAGS)
    try:
        for topic in TOPICS:
            complete(server, prompt(topic))
        replies: dict[int, dict] = {}

        def ask(i: int) -> None:
            replies[i] = complete(server, prompt(TOPICS[i % len(TOPICS)]))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
        for thread in threads[:6]:
            thread.start()
        os.kill(server.child_pid("cache_tier"), signal.SIGKILL)  # spills and fetches under way
        for thread in threads[6:]:
            thread.start()
        for thread in threads:
            thread.join(180)
        assert sorted(replies) == list(range(12))
        assert all(reply["usage"]["completion_tokens"] == 6 for reply in replies.values())
        server.wait_for("child_started", timeout_s=60, count=2, child="cache_tier")
        server.wait_for("actor_started", timeout_s=60, pid=server.child_pid("cache_tier"))
        assert settle(server)["tiers"]["disk"]["pending_blocks"] == 0  # the new cache_tier wrote what the old one left
        fresh = ("glacier lake surveyors", "island ferry captains")  # never batched with others
        alone = {topic: complete(server, prompt(topic))["choices"][0]["text"] for topic in fresh}
        for topic in TOPICS:  # they leave the pool, and the host too
            complete(server, prompt(topic))
        for topic in fresh:  # back from whichever tier holds them now, with the tokens drawn alone
            assert complete(server, prompt(topic))["choices"][0]["text"] == alone[topic]
    finally:
        server.stop()
        remove_segments(tmp_path / "data")


def test_a_full_disk_costs_recomputes_and_a_warning_and_the_server_serves_on(tmp_path):
    """The disk tier's directory on a disk with room for about one block of the default model:
    spills fail with a warning naming ENOSPC, the prompts the disk did not take are recomputed with
    the tokens they drew before, and the server serves on."""
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        server = start_server(tmp_path / "data", *FLAGS, "--disk-kv-dir", str(disk))
        try:
            first = [complete(server, prompt(topic)) for topic in TOPICS]
            settle(server)
            assert server.find("disk_tier_write_failed", errno="ENOSPC")
            again = [complete(server, prompt(topic)) for topic in TOPICS]  # the pool and the host moved on
            assert [r["choices"][0]["text"] for r in again] == [r["choices"][0]["text"] for r in first]
        finally:
            server.stop()
            remove_segments(tmp_path / "data")


async def test_blocks_kept_under_old_weights_are_never_served_under_new_ones(tmp_path):
    """Prompts computed under one checkpoint leave their blocks in the pool, the host and the disk;
    after an update from disk to other weights, the same prompts draw the new weights' tokens
    (transformers'), not tokens of the kept KV."""
    base = build_model_dir(tmp_path / "base", arch="llama", size="tiny", seed=3)
    new = build_model_dir(tmp_path / "new", arch="llama", size="tiny", seed=4)
    prompts = [[10 + (7 * i + 3 * j) % 900 for j in range(200)] for i in range(4)]  # 12 whole blocks each
    server = start_server(tmp_path / "data", *FLAGS, model=str(base))
    nc = await server.connect_nats()
    try:
        for ids in prompts:
            await generate(nc, ids, 4)
        assert (await asyncio.to_thread(settle, server))["tiers"]["disk"]["blocks"] > 0  # on every tier now
        updated = await ask(nc, UpdateFromDisk(str(new)))
        assert isinstance(updated, WeightsUpdated) and updated.success, updated
        reference = Reference(new)
        for ids in prompts:
            assert (await generate(nc, ids, 4)).token_ids == reference(ids, 4)
    finally:
        await nc.drain()
        server.stop()
        remove_segments(tmp_path / "data")
