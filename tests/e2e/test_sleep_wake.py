"""Sleep and wake through a real server while requests stream: SGLang's
`/release_memory_occupation` (every tag, or the KV cache alone) and `/resume_memory_occupation`,
and vLLM's `/sleep`, `/wake_up?tags=` and `/is_sleeping`. The running requests are retracted and
finish after the wake with the greedy tokens of an uninterrupted run, none lost and none repeated;
requests that arrive while asleep wait and complete after the wake.

Sleep and wake leave the weights as they were, so the shared server serves here; each test wakes
it whatever happens."""

import asyncio
import json

import httpx
import pytest

PROMPTS = [[12, 40, 7, 99, 31, 64, 5, 250], [3, 17, 88, 120, 9], [200, 201, 14, 77, 6, 45]]
LATE = [55, 66, 77, 88]
MAX_NEW_TOKENS = 200
GREEDY = {"temperature": 0, "ignore_eos": True}


def body(input_ids: list[int], stream: bool = False) -> dict:
    return {"input_ids": input_ids, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, **GREEDY}, "stream": stream}


async def streamed(http: httpx.AsyncClient, input_ids: list[int], first_token: asyncio.Event) -> list[list[int]]:
    """The `output_ids` of every event of a streamed /generate (each the tokens so far)."""
    seen = []
    async with http.stream("POST", "/generate", json=body(input_ids, True)) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                seen.append(json.loads(line.removeprefix("data: "))["output_ids"])
                if seen[-1]:
                    first_token.set()
    return seen


async def asleep_while_streaming(server, sleep: tuple[str, dict], wakes: list[tuple[str, dict]]) -> None:
    """Streams PROMPTS, sleeps once each drew a token, sends LATE, checks it waits and that the server
    says it sleeps, wakes with each of `wakes` in turn; then every request has its unpaused tokens."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        whole = await asyncio.gather(*(http.post("/generate", json=body(p)) for p in PROMPTS + [LATE]))
        unpaused = [reply.json()["output_ids"] for reply in whole]
        started = [asyncio.Event() for _ in PROMPTS]
        streams = [asyncio.create_task(streamed(http, p, e)) for p, e in zip(PROMPTS, started)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        path, params = sleep
        try:
            slept = await http.post(path, **params)
            assert slept.status_code == 200, slept.text
            late = asyncio.create_task(http.post("/generate", json=body(LATE)))
            await asyncio.sleep(0.5)
            assert not late.done()  # waits, not refused
            assert not any(stream.done() for stream in streams)  # retracted mid-way, waiting too
            assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
            assert (await http.get("/v1/loads")).json()["loads"][0]["num_running_reqs"] == 0  # retracted
        finally:
            for path, params in wakes:
                woke = await http.post(path, **params)
                assert woke.status_code == 200, woke.text
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}
        for events, whole in zip(await asyncio.gather(*streams), unpaused):
            assert events[-1] == whole  # nothing lost
            for before, after in zip(events, events[1:]):
                assert after[: len(before)] == before  # nothing drawn twice or taken back
        assert (await late).json()["output_ids"] == unpaused[-1]


@pytest.mark.parametrize(
    "tags",
    [{}, {"tags": None}, {"tags": ["kv_cache"]}],
    ids=["every-tag", "tags-null", "kv-cache-alone"],
)
async def test_sglang_release_and_resume_while_requests_stream(server, tags):
    sleep = ("/release_memory_occupation", {"json": tags})
    await asleep_while_streaming(server, sleep, [("/resume_memory_occupation", {"json": tags})])


async def test_sglang_release_answers_the_memory_state(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        try:
            released = (await http.post("/release_memory_occupation", json={"tags": ["kv_cache"]})).json()
            assert released["success"] is True and "kv_cache" in released["released"]
            assert "weights" not in released["released"]
        finally:
            resumed = (await http.post("/resume_memory_occupation", json={"tags": ["kv_cache"]})).json()
        assert resumed["success"] is True and resumed["released"] == []


async def test_vllm_sleep_and_wake_by_tag_while_requests_stream(server):
    """vLLM's RL sequence: sleep, wake the weights (to update them), then the KV cache. It sleeps
    until both are back."""
    wakes = [("/wake_up", {"params": {"tags": "weights"}}), ("/wake_up", {"params": {"tags": "kv_cache"}})]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        try:
            assert (await http.post("/sleep", params={"level": "1"})).status_code == 200
            assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
            assert (await http.post("/wake_up", params={"tags": "weights"})).status_code == 200
            assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}  # the KV cache sleeps on
        finally:
            assert (await http.post("/wake_up", params={"tags": "kv_cache"})).status_code == 200
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}
    await asleep_while_streaming(server, ("/sleep", {}), wakes)


async def test_vllm_sleep_level_2_wakes_whole(server):
    await asleep_while_streaming(server, ("/sleep", {"params": {"level": "2"}}), [("/wake_up", {})])
