"""On an external NATS the saved sessions live in its JetStream, not in a server's data dir: a
session continues on a new server with an empty data dir (another machine, as far as it can
tell), with the output of a run that never restarted."""

import asyncio

from kernel.nats_server import EmbeddedNats
from ops.local_server import start_server
from tests.e2e.test_durable_sessions import TURNS, open_session, turn_output

FLAGS = ("--num-kv-blocks", "128")


async def test_a_session_continues_on_a_new_server_with_an_empty_data_dir(tmp_path):
    nats_server = EmbeddedNats(tmp_path / "nats")  # JetStream on, as a shared NATS would have it
    await nats_server.start()
    try:
        first = await asyncio.to_thread(start_server, tmp_path / "first", "--nats-url", nats_server.url, *FLAGS)
        try:
            reference, session = open_session(first), open_session(first)
            never_restarted = [turn_output(first, reference, ids) for ids in TURNS]
            assert [turn_output(first, session, ids) for ids in TURNS[:2]] == never_restarted[:2]
        finally:
            assert await asyncio.to_thread(first.stop) == 0
        assert not (tmp_path / "first" / "sessions").exists()  # nothing in the first machine's files

        second = await asyncio.to_thread(start_server, tmp_path / "second", "--nats-url", nats_server.url, *FLAGS)
        try:
            assert [e["bucket"] for e in second.find("session_store_opened") if "bucket" in e]
            assert turn_output(second, session, TURNS[2]) == never_restarted[2]
            assert second.find("sessions_restored")[-1]["sessions"] >= 2
        finally:
            await asyncio.to_thread(second.stop)
    finally:
        await nats_server.stop()
