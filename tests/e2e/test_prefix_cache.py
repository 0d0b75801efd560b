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
