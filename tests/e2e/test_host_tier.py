"""The host KV tier through the whole stack, with the disk tier behind it: a GPU pool too small for
the working set, a host tier larger than it. A prompt whose prefix the pool evicted is loaded back
from host memory, not recomputed, and draws the tokens it drew when computed from scratch.
`/admin/cache` and `/metrics` show, per tier, what it holds and which tier served each block, as it
happened; a flush of one tier empties it (the disk's files too), and requests draw the same tokens
after it, recomputing what it held."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.cache_tier.actor import DEFAULT_DIR
from actors.cache_tier.host_segment import remove_segments  # what a server that did not stop cleanly left
from ops.local_server import start_server
from tests.e2e.tier_requests import cache_report, complete, prompt, settle

POOL_BLOCKS = 24  # 384 tokens of 16: room for about two of the prompts below (13 whole blocks each)
HOST_SLOTS = 64  # room for about five
TOPICS = ("river valley farmers", "mountain railway builders", "harbour town fishermen")
# More than the host holds: the first of them leave it, for the disk only.
MORE_TOPICS = tuple(f"guild number {i} of the {trade}" for i, trade in enumerate(("weavers", "masons", "smiths") * 3))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("host-tier")
    flags = ("--num-kv-blocks", str(POOL_BLOCKS), "--host-kv-blocks", str(HOST_SLOTS), "--disk-kv-gb", "1")
    running = start_server(data_dir, *flags)
    yield running
    running.stop()
    remove_segments(data_dir)


def cached_blocks(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"] // 16


def test_an_evicted_prefix_is_loaded_from_the_host_and_draws_the_same_tokens(server):
    first = [complete(server, prompt(topic)) for topic in TOPICS]
    assert all(reply["usage"]["prompt_tokens"] > POOL_BLOCKS * 16 // 3 for reply in first)  # a third of the pool each
    host = settle(server)["tiers"]["host"]
    assert host["capacity_blocks"] == HOST_SLOTS and host["blocks"] > POOL_BLOCKS  # more than the pool holds
    report = cache_report(server)

    again = complete(server, prompt(TOPICS[0]))  # its blocks left the pool for the other two's
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= again["usage"]["prompt_tokens"] - 16  # all its whole blocks but the last token's
    after = cache_report(server)
    assert after["tiers"]["host"]["hits"] - report["tiers"]["host"]["hits"] == cached // 16
    assert after["hit_tokens"] == report["hit_tokens"]  # none of it from the GPU's own cache
    assert again["choices"][0]["text"] == first[0]["choices"][0]["text"]  # as computed from scratch


def test_each_tier_shows_what_it_holds_and_served_and_a_flush_empties_it(server):
    files = lambda: list((server.data_dir / DEFAULT_DIR).rglob("*.kv"))  # noqa: E731
    first = {topic: complete(server, prompt(topic))["choices"][0]["text"] for topic in MORE_TOPICS}
    settle(server)
    from_disk, disk_hits = served(server, MORE_TOPICS[0])  # gone from the pool and the host
    assert disk_hits["disk"] > 0 and sum(disk_hits.values()) == cached_blocks(from_disk)
    from_host, host_hits = served(server, MORE_TOPICS[-2])  # gone from the pool only
    assert host_hits["host"] > 0 and host_hits["disk"] == 0 and sum(host_hits.values()) == cached_blocks(from_host)
    from_gpu, gpu_hits = served(server, MORE_TOPICS[-2])
    assert gpu_hits == {"gpu": cached_blocks(from_gpu), "host": 0, "disk": 0} and gpu_hits["gpu"] > 0
    for topic, reply in ((MORE_TOPICS[0], from_disk), (MORE_TOPICS[-2], from_host), (MORE_TOPICS[-2], from_gpu)):
        assert reply["choices"][0]["text"] == first[topic]

    tiers = settle(server)["tiers"]
    gpu, host, disk = tiers["gpu"], tiers["host"], tiers["disk"]
    block_bytes = host["bytes"] // host["blocks"]
    assert (gpu["capacity_blocks"], host["capacity_blocks"], disk["capacity_bytes"]) == (POOL_BLOCKS, HOST_SLOTS, 10**9)
    assert all(tier["blocks"] > 0 and tier["bytes"] == tier["blocks"] * block_bytes for tier in (gpu, host))
    assert disk["blocks"] > 0 and disk["bytes"] == sum(f.stat().st_size for f in files())  # headers and all
    # Each tier is asked for what the one before it lacked.
    assert host["lookups"] == gpu["lookups"] - gpu["hits"] and disk["lookups"] == host["lookups"] - host["hits"]
    samples = scrape(server)
    for name, tier in tiers.items():
        for family, field in FAMILIES.items():
            assert samples[family, name] == tier[field], (family, name)
    external = (host["hits"] + disk["hits"]) * 16  # vLLM's, in tokens
    assert samples["vllm:external_prefix_cache_hits_total", None] == external

    assert flush(server, "disk") == {"disk": disk["blocks"]}
    assert files() == [] and cache_report(server)["tiers"]["disk"]["blocks"] == 0
    recomputed, hits = served(server, MORE_TOPICS[1])  # held by the disk alone
    assert hits["disk"] == 0 and recomputed["choices"][0]["text"] == first[MORE_TOPICS[1]]

    held = settle(server)["tiers"]["host"]["blocks"]
    assert flush(server, "host") == {"host": held} and cache_report(server)["tiers"]["host"]["blocks"] == 0
    recomputed, hits = served(server, MORE_TOPICS[-3])  # held by the host alone
    assert hits["host"] == 0 and recomputed["choices"][0]["text"] == first[MORE_TOPICS[-3]]

    settle(server)
    refused = httpx.post(f"{server.base_url}/admin/flush_cache", json={"tier": "tape"}, timeout=10)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tier"
    assert "(one of 'all', 'disk', 'gpu', 'host')" in refused.json()["error"]["message"]
    assert set(flush(server, "all")) == {"gpu", "host", "disk"}
    assert files() == [] and all(tier["blocks"] == 0 for tier in cache_report(server)["tiers"].values())
    recomputed = complete(server, prompt(MORE_TOPICS[-2]))
    assert cached_blocks(recomputed) == 0 and recomputed["choices"][0]["text"] == first[MORE_TOPICS[-2]]


# /metrics' per-tier families, and the /admin/cache field each shows.
FAMILIES = {
    "kernel_llm:kv_tier_blocks": "blocks",
    "kernel_llm:kv_tier_bytes": "bytes",
    "kernel_llm:kv_tier_capacity_blocks": "capacity_blocks",
    "kernel_llm:kv_tier_capacity_bytes": "capacity_bytes",
    "kernel_llm:kv_tier_pending_blocks": "pending_blocks",
    "kernel_llm:kv_tier_hits_total": "hits",
    "kernel_llm:kv_tier_lookups_total": "lookups",
}


def served(server, topic: str) -> tuple[dict, dict[str, int]]:
    """The reply to `topic`'s prompt, and the blocks each tier served it."""
    before = cache_report(server)["tiers"]
    reply = complete(server, prompt(topic))
    after = cache_report(server)["tiers"]
    return reply, {name: after[name]["hits"] - before[name]["hits"] for name in after}


def flush(server, tier: str) -> dict[str, int]:
    """POST /admin/flush_cache of `tier`: the blocks each tier flushed dropped."""
    response = httpx.post(f"{server.base_url}/admin/flush_cache", json={"tier": tier}, timeout=70)
    assert response.status_code == 200, response.text
    flushed = response.json()
    assert flushed["freed_blocks"] == sum(flushed["tiers"].values())
    return flushed["tiers"]


def scrape(server) -> dict[tuple[str, str | None], float]:
    """/metrics' samples by (name, tier label)."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    families = text_string_to_metric_families(text)
    return {(s.name, s.labels.get("tier")): s.value for family in families for s in family.samples}
