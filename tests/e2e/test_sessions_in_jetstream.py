"""On an external NATS the saved sessions live in its JetStream, not in a server's data dir, and so
do the KV chains the disk tier wrote (an object bucket): a session continues on a new server with
an empty data dir (another machine, as far as it can tell), with the output of a run that never
restarted, and its earlier turns come from the first server's chains instead of being recomputed."""

import asyncio

from actors.cache_tier.actor import DEFAULT_DIR
from actors.cache_tier.host_segment import remove_segments  # what a server that did not stop cleanly left
from kernel.nats_server import EmbeddedNats
from ops.local_server import start_server
from tests.e2e.test_durable_sessions import TURNS, open_session, turn_output, turn_reply
from tests.e2e.tier_requests import cache_report, settle

FLAGS = ("--num-kv-blocks", "128", "--host-kv-blocks", "64", "--disk-kv-gb", "1")


async def test_a_session_continues_on_a_new_server_with_an_empty_data_dir(tmp_path):
    nats_server = EmbeddedNats(tmp_path / "nats")  # JetStream on, as a shared NATS would have it
    await nats_server.start()
    try:
        first = await asyncio.to_thread(start_server, tmp_path / "first", "--nats-url", nats_server.url, *FLAGS)
        try:
            reference, session = open_session(first), open_session(first)
            never_restarted = [turn_output(first, reference, ids) for ids in TURNS]
            first_two = [turn_output(first, session, ids) for ids in TURNS[:2]]
            assert first_two == never_restarted[:2]
            await asyncio.to_thread(settle, first)  # every block on the first machine's disk
        finally:
            assert await asyncio.to_thread(first.stop) == 0
        assert not (tmp_path / "first" / "sessions").exists()  # nothing in the first machine's files
        assert first.find("kv_chains_shared")
        assert not (tmp_path / "second").exists()  # another machine's empty data dir

        second = await asyncio.to_thread(start_server, tmp_path / "second", "--nats-url", nats_server.url, *FLAGS)
        try:
            assert [e["bucket"] for e in second.find("session_store_opened") if "bucket" in e]
            # Pulled in the background once the scheduler listed the disk, at its start.
            await asyncio.to_thread(second.wait_for, "kv_chains_pulled", 60)
            assert list((tmp_path / "second" / DEFAULT_DIR).rglob("*.kv"))
            meta, output = turn_reply(second, session, TURNS[2])
            assert (meta["prompt_tokens"], output) == never_restarted[2]
            assert second.find("sessions_restored")[-1]["sessions"] >= 2
            # The first two turns came from the first server's chains, pulled into this disk.
            second_turn_blocks = (first_two[1][0] + len(first_two[1][1])) // 16 * 16
            assert meta["cached_tokens"] >= second_turn_blocks
            assert cache_report(second)["tiers"]["disk"]["hits"] > 0
        finally:
            await asyncio.to_thread(second.stop)
    finally:
        await nats_server.stop()
        remove_segments(tmp_path / "first")
        remove_segments(tmp_path / "second")
