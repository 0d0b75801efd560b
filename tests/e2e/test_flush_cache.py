"""SGLang's `/flush_cache` through a real server, as RL clients poll it before an update or a
release: 200 on GET and POST when nothing runs, 400 while a request runs (the client retries), 200
again once it finished or was paused; the cache it flushed is gone. vLLM's `/reset_prefix_cache`."""

import asyncio

import httpx

LONG = {"input_ids": [12, 40, 7, 99], "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}


async def test_flush_is_200_idle_and_400_while_a_request_runs(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        cached = (await http.post("/generate", json=LONG | {"sampling_params": {"max_new_tokens": 2}})).json()
        assert cached["meta_info"]["finish_reason"]["type"] == "length"
        for method in ("GET", "POST"):
            response = await http.request(method, "/flush_cache")
            assert response.status_code == 200, response.text
            assert response.json()["success"] is True
        assert (await http.get("/admin/cache")).json()["cached_blocks"] == 0

        running = asyncio.create_task(http.post("/generate", json=LONG))
        await until_running(http)
        busy = await http.get("/flush_cache")
        assert busy.status_code == 400 and "running" in busy.json()["error"]["message"]
        assert (await running).status_code == 200
        assert (await http.get("/flush_cache")).status_code == 200  # what a retrying client sees next


async def test_flush_after_a_pause_answers_200(server):
    """slime's update: pause_generation (abort), then flush_cache until 200, then the update."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        running = asyncio.create_task(http.post("/generate", json=LONG))
        await until_running(http)
        try:
            assert (await http.post("/pause_generation", json={"mode": "in_place"})).status_code == 200
            assert (await http.get("/flush_cache")).status_code == 200  # paused requests do not run
        finally:
            assert (await http.post("/continue_generation", json={})).status_code == 200
        assert len((await running).json()["output_ids"]) == 400


def test_vllm_reset_prefix_cache_flushes_whatever_runs(server):
    response = httpx.post(f"{server.base_url}/reset_prefix_cache")
    assert response.status_code == 200 and "freed_blocks" in response.json()


async def until_running(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(60):
        while (await http.get("/v1/loads")).json()["loads"][0]["num_running_reqs"] == 0:
            await asyncio.sleep(0.01)
