"""The disk tier through the whole stack: a GPU pool and a host tier both too small for the working
set, a disk tier behind them (the cache_tier actor). A prompt whose blocks left the pool and the
host is read back from disk instead of recomputed, also after the whole server restarted on the same
data dir, and draws the tokens it drew when computed from scratch; a damaged block file is detected
and recomputed, with the same tokens."""

import httpx
import pytest

from actors.cache_tier.actor import DEFAULT_DIR
from actors.cache_tier.host_segment import SHM_DIR
from actors.executor.kv_moves import segment_prefix
from ops.local_server import start_server

POOL_BLOCKS = 24  # 384 tokens of 16: room for about two of the prompts below
HOST_SLOTS = 32  # and the host for not many more
FLAGS = ("--num-kv-blocks", str(POOL_BLOCKS), "--host-kv-blocks", str(HOST_SLOTS), "--disk-kv-gb", "1")
TOPICS = ("river valley farmers", "mountain railway builders", "harbour town fishermen", "desert caravan guides")


def prompt(topic: str) -> str:
    return f"A long shared preamble about the {topic}, repeated so that it fills many KV blocks. " * 5


def complete(server, text: str) -> dict:
    body = {"model": "demo", "prompt": text, "max_tokens": 6, "temperature": 0}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def cache_report(server) -> dict:
    response = httpx.get(f"{server.base_url}/admin/cache", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def cached_tokens(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def settle(server) -> dict:
    """Waits until the disk tier has every block the host indexed (spills run in the background)."""
    import time

    for _ in range(100):
        report = cache_report(server)
        if report["disk_pending_blocks"] == 0:
            return report
        time.sleep(0.1)
    return report


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("disk-tier")
    yield path
    for segment in SHM_DIR.glob(f"{segment_prefix(str(path))}*"):
        segment.unlink()


def test_blocks_gone_from_the_pool_and_the_host_come_back_from_disk_also_after_a_restart(data_dir):
    server = start_server(data_dir, *FLAGS)
    try:
        first = [complete(server, prompt(topic)) for topic in TOPICS]
        settle(server)
        again = complete(server, prompt(TOPICS[0]))  # the pool and the host both moved on
        report = cache_report(server)
        assert report["disk_fetched_blocks"] > 0
        assert cached_tokens(again) >= again["usage"]["prompt_tokens"] - 16
        assert again["choices"][0]["text"] == first[0]["choices"][0]["text"]
        settle(server)
    finally:
        server.stop()

    server = start_server(data_dir, *FLAGS)  # the whole server again, on the same data dir
    try:
        after = complete(server, prompt(TOPICS[1]))
        assert cached_tokens(after) >= after["usage"]["prompt_tokens"] - 16  # nothing recomputed the disk held
        assert cache_report(server)["disk_fetched_blocks"] > 0
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
