"""The prefix cache through the whole stack: a repeated prompt reports cached tokens, only
within the tenant (the `user` field) that sent it."""

import httpx

LONG_PROMPT = "The history of the river valley, told from the first farmers to the present day. " * 6


def complete(server, user: str) -> dict:
    body = {"model": "demo", "prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0, "user": user}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_repeated_prompt_is_served_from_the_cache_within_its_tenant(server):
    first = complete(server, "tenant-a")
    again = complete(server, "tenant-a")
    other = complete(server, "tenant-b")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < again["usage"]["prompt_tokens"]
    assert cached % 16 == 0  # whole KV blocks
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["choices"][0]["text"] == first["choices"][0]["text"] == other["choices"][0]["text"]


def test_a_prefix_five_tenants_sent_becomes_public(server):
    """The default publication rule (K = 5): private until the fifth tenant sends it, then a hit for all."""
    prompt = "A system prompt that many tenants share, word for word, at the start of every request. " * 4

    def cached(user: str) -> int:
        body = {"model": "demo", "prompt": prompt, "max_tokens": 2, "temperature": 0, "user": user}
        reply = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert [cached(f"shared-{i}") for i in range(4)] == [0, 0, 0, 0]
    assert cached("shared-4") > 0  # the fifth sender already reads it
    assert cached("a-later-tenant") > 0


def cache_report(server) -> dict:
    response = httpx.get(f"{server.base_url}/admin/cache", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def test_an_admin_published_prefix_hits_for_every_tenant(server):
    system = "You are the shared assistant of the river valley archive. Answer from the archive only." * 3
    published = httpx.post(f"{server.base_url}/admin/publish", json={"text": system}, timeout=30).json()
    assert published["tokens"] > 0 and published["tokens"] % 16 == 0

    def cached(user: str, question: str) -> int:
        body = {"model": "demo", "prompt": system + question, "max_tokens": 2, "temperature": 0, "user": user}
        reply = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("pub-first", " Question: who farmed first?") == 0  # computes it, public from the start
    assert cached("pub-second", " Question: when did the river move?") >= published["tokens"] - 16
    assert cache_report(server)["public_blocks"] >= published["tokens"] // 16


def test_admin_cache_shows_private_blocks_per_tenant_and_goes_back_to_idle(server):
    body = {
        "model": "demo",
        "prompt": LONG_PROMPT + " Private note.",
        "max_tokens": 3,
        "temperature": 0,
        "user": "report-tenant",
    }
    assert httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).status_code == 200
    report = cache_report(server)
    assert report["private_blocks"]["report-tenant"] > 0
    assert report["in_use_blocks"] == 0  # nothing runs now
    assert report["free_blocks"] + report["cached_blocks"] == report["total_blocks"]
    assert 0 < report["hit_rate"] <= 1
    bad = httpx.post(f"{server.base_url}/admin/publish", json={"text": "a", "input_ids": [1]}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text"
