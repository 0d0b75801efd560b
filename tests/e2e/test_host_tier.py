"""The host KV tier through the whole stack: a GPU pool too small for the working set, a host tier
larger than it. A prompt whose prefix the pool evicted is loaded back from host memory, not
recomputed, and draws the tokens it drew when computed from scratch."""

import httpx
import pytest

from actors.cache_tier.host_segment import SHM_DIR
from actors.executor.kv_moves import segment_prefix
from ops.local_server import start_server

POOL_BLOCKS = 24  # 384 tokens of 16: room for about two of the prompts below
TOPICS = ("river valley farmers", "mountain railway builders", "harbour town fishermen")


def prompt(topic: str) -> str:
    return f"A long shared preamble about the {topic}, repeated so that it fills many KV blocks. " * 5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("host-tier")
    running = start_server(data_dir, "--num-kv-blocks", str(POOL_BLOCKS), "--host-kv-blocks", "96")
    yield running
    running.stop()
    for segment in SHM_DIR.glob(f"{segment_prefix(str(data_dir))}*"):
        segment.unlink()


def complete(server, text: str) -> dict:
    body = {"model": "demo", "prompt": text, "max_tokens": 6, "temperature": 0}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def cache_report(server) -> dict:
    response = httpx.get(f"{server.base_url}/admin/cache", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def test_an_evicted_prefix_is_loaded_from_the_host_and_draws_the_same_tokens(server):
    first = [complete(server, prompt(topic)) for topic in TOPICS]
    assert all(reply["usage"]["prompt_tokens"] > POOL_BLOCKS * 16 // 3 for reply in first)  # a third of the pool each
    report = cache_report(server)
    assert report["host_slots"] == 96 and report["host_used_slots"] > POOL_BLOCKS  # more than the pool holds
    hits_before = report["host_hit_blocks"]

    again = complete(server, prompt(TOPICS[0]))  # its blocks left the pool for the other two's
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= again["usage"]["prompt_tokens"] - 16  # all its whole blocks but the last token's
    after = cache_report(server)
    assert after["host_hit_blocks"] - hits_before == cached // 16
    assert after["hit_tokens"] == report["hit_tokens"]  # none of it from the GPU's own cache
    assert again["choices"][0]["text"] == first[0]["choices"][0]["text"]  # as computed from scratch
