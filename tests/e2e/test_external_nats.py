"""With `--nats-url` the supervisor starts no server of its own; when the external one goes away
and comes back on the same address, every actor reconnects and the deployment serves again."""

import asyncio
import os
import signal
import time

import httpx

from kernel.nats_server import EmbeddedNats
from ops.local_server import start_server


def complete(server) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/completions", json={"model": "demo", "prompt": "Hello", "max_tokens": 4}, timeout=30
    )


async def test_actors_reconnect_when_the_external_server_returns(tmp_path):
    (tmp_path / "nats").mkdir()
    nats_server = EmbeddedNats(tmp_path / "nats")
    await nats_server.start()
    server = await asyncio.to_thread(
        start_server, tmp_path / "data", "--nats-url", nats_server.url, "--num-kv-blocks", "64"
    )
    try:
        assert (await asyncio.to_thread(complete, server)).status_code == 200
        assert not server.find("nats_started"), "the supervisor started a server of its own"
        os.kill(nats_server.process.pid, signal.SIGKILL)
        await asyncio.sleep(1.0)
        await nats_server.start()  # same port, same data dir
        deadline = time.monotonic() + 60
        while (
            status := (await asyncio.to_thread(complete, server)).status_code
        ) != 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert status == 200
        assert len(server.find("bus_reconnected")) >= 5  # every actor, the supervisor too
    finally:
        await asyncio.to_thread(server.stop)
        await nats_server.stop()
