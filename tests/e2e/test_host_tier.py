"""The host KV tier through the whole stack: a GPU pool too small for the working set, a host tier
larger than it. A prompt whose prefix the pool evicted is loaded back from host memory, not
recomputed, and draws the tokens it drew when computed from scratch."""

import pytest

from ops.local_server import start_server
from tests.e2e.tier_requests import cache_report, complete, prompt, remove_segments

POOL_BLOCKS = 24  # 384 tokens of 16: room for about two of the prompts below
TOPICS = ("river valley farmers", "mountain railway builders", "harbour town fishermen")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("host-tier")
    running = start_server(data_dir, "--num-kv-blocks", str(POOL_BLOCKS), "--host-kv-blocks", "96")
    yield running
    running.stop()
    remove_segments(data_dir)


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
