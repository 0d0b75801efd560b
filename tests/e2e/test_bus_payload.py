"""A prompt crosses the bus whole, so the bus's payload limit (`--bus-max-payload`) bounds it: a
longer one gets a clear 400, and the server goes on serving the ones that fit, with the tokens of a
server whose limit is NATS's default."""

import httpx
import pytest

from ops.local_server import start_server

MAX_PAYLOAD = 8192  # bytes: a prompt of token ids from 256 up takes 3 bytes a token


@pytest.fixture(scope="module")
def small_bus_server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("small-bus"), "--num-kv-blocks", "512",
                           "--bus-max-payload", str(MAX_PAYLOAD), "--max-prefill-tokens", "4096")
    yield running
    running.stop()


def body(prompt_ids: list[int]) -> dict:
    return {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}


async def test_a_prompt_over_the_bus_limit_gets_400_and_the_rest_are_served(small_bus_server, server):
    too_long = [300 + i % 1700 for i in range(3000)]  # 9 KB
    fits = [300 + i % 1700 for i in range(2000)]  # 6 KB
    async with httpx.AsyncClient(base_url=small_bus_server.base_url, timeout=60) as http:
        refused = await http.post("/generate", json=body(too_long))
        served = await http.post("/generate", json=body(fits))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and "--bus-max-payload" in error["message"]
    assert served.status_code == 200, served.text
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:  # NATS's default limit
        reference = (await http.post("/generate", json=body(fits))).json()
    assert served.json()["token_ids"] == reference["token_ids"] and len(reference["token_ids"]) == 6
