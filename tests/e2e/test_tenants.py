"""API keys and tenants through HTTP with the openai SDK: the tenant comes from the key, cached
prefixes never cross tenants, and a client cannot borrow another tenant's name."""

import json

import httpx
import openai
import pytest

from ops.local_server import start_server

PROMPT = "Our company handbook, chapter one: the principles we hold and the way we work together. " * 5
KEYS = {"key-alpha": "alpha", "key-beta": "beta"}
ADMIN_KEY = "admin-secret"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tenants")
    keys_file = data_dir / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    running = start_server(data_dir, "--num-kv-blocks", "256", "--api-keys", str(keys_file), "--admin-key", ADMIN_KEY)
    yield running
    running.stop()


def client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def cached(server, key: str, user: str | None = None) -> int:
    extra = {"user": user} if user else {}
    reply = client(server, key).completions.create(model="demo", prompt=PROMPT, max_tokens=2, temperature=0, **extra)
    return reply.usage.prompt_tokens_details.cached_tokens


def test_keys_are_required_and_checked(keyed_server):
    with pytest.raises(openai.AuthenticationError):
        client(keyed_server, "wrong-key").models.list()
    assert httpx.post(f"{keyed_server.base_url}/v1/completions", json={"prompt": "x"}).status_code == 401
    assert httpx.get(f"{keyed_server.base_url}/health").status_code == 200
    assert [m.id for m in client(keyed_server, "key-alpha").models.list().data] == ["demo"]


def test_a_tenant_prefix_stays_private_even_to_a_client_naming_that_tenant(keyed_server):
    assert cached(keyed_server, "key-alpha") == 0
    assert cached(keyed_server, "key-alpha") > 0
    assert cached(keyed_server, "key-beta") == 0
    assert cached(keyed_server, "key-beta", user="alpha") == 0  # `user` narrows within beta only


def test_admin_routes_need_the_admin_key(keyed_server):
    url = f"{keyed_server.base_url}/admin/stats"
    assert httpx.get(url, headers={"Authorization": "Bearer key-alpha"}).status_code == 401
    response = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 200 and response.json()["total_blocks"] == 256
