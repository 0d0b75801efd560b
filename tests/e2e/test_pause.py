"""Pausing generation through a real server: streaming requests in flight, paused in each mode
(SGLang's /pause_generation, vLLM's /pause), continued; every request completes with the tokens of
an unpaused run (greedy), aborted ones with finish_reason "abort" and the tokens they drew;
requests sent during the pause are held, not refused, and complete after it."""

import asyncio
import json

import httpx
import pytest

PROMPTS = [[12, 40, 7, 99, 31, 64, 5, 250], [3, 17, 88, 120, 9], [200, 201, 14, 77, 6, 45]]
LATE = [55, 66, 77, 88]
GREEDY = {"temperature": 0, "ignore_eos": True}


def body(input_ids: list[int], max_new_tokens: int, stream: bool = False) -> dict:
    return {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, **GREEDY}, "stream": stream}


async def streamed(http: httpx.AsyncClient, request: dict, first_token: asyncio.Event) -> dict:
    """The last event of a streamed /generate; sets `first_token` once it has drawn one."""
    last = None
    async with http.stream("POST", "/generate", json=request) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                last = json.loads(line.removeprefix("data: "))
                if last["output_ids"]:
                    first_token.set()
    return last


@pytest.fixture(scope="module")
def unpaused(server):
    """The replies of runs without a pause (PROMPTS, then LATE) by max_new_tokens: computed once for
    every test that compares with them, as greedy runs of the same server give the same tokens."""
    replies: dict[int, list[dict]] = {}

    async def of(max_new_tokens: int) -> list[dict]:
        if max_new_tokens not in replies:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
                replies[max_new_tokens] = [
                    (await http.post("/generate", json=body(p, max_new_tokens))).json() for p in PROMPTS + [LATE]
                ]
        return replies[max_new_tokens]

    return of


async def paused_run(server, pause: tuple[str, dict], unpaused: list[dict]) -> tuple[list[dict], dict, bool]:
    """Streams PROMPTS as long as the `unpaused` replies, pauses once each drew a token, sends LATE,
    checks it is held, continues; returns the streams' last events, LATE's reply, and whether every
    stream still ran a second into the pause (so the pause held it mid-way)."""
    max_new_tokens = len(unpaused[-1]["output_ids"])
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        started = [asyncio.Event() for _ in PROMPTS]
        streams = [
            asyncio.create_task(streamed(http, body(p, max_new_tokens, True), e)) for p, e in zip(PROMPTS, started)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        path, params = pause
        reply = await http.post(path, **params)
        assert reply.status_code == 200, reply.text
        try:
            late = asyncio.create_task(http.post("/generate", json=body(LATE, max_new_tokens)))
            await asyncio.sleep(1.0)
            assert not late.done()  # held, not refused
            held_mid_way = not any(stream.done() for stream in streams)
            assert (await http.get("/is_paused")).json() == {"is_paused": True}
            load = (await http.get("/v1/loads")).json()["loads"][0]
            if params.get("json", {}).get("mode") in ("retract", "in_place"):
                assert load["num_running_reqs"] == 0  # paused requests do not count as running
        finally:
            assert (await http.post("/continue_generation", json={"torch_empty_cache": True})).status_code == 200
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
        ends = await asyncio.gather(*streams)
        return ends, (await late).json(), held_mid_way


@pytest.mark.parametrize(
    "pause",
    [
        ("/pause_generation", {"json": {"mode": "retract"}}),
        ("/pause_generation", {"json": {"mode": "in_place"}}),
        ("/pause", {"params": {"mode": "keep"}}),
    ],
    ids=["retract", "in_place", "vllm-keep"],
)
async def test_retract_and_in_place_lose_no_token(server, unpaused, pause):
    whole_runs = await unpaused(120)
    ends, late, held_mid_way = await paused_run(server, pause, whole_runs)
    assert held_mid_way, "a stream ended before the pause: nothing was tested"
    for end, whole in zip(ends + [late], whole_runs):
        assert end["output_ids"] == whole["output_ids"]
        assert end["meta_info"]["finish_reason"]["type"] == "length"


async def test_abort_ends_requests_with_their_partial_tokens(server, unpaused):
    whole_runs = await unpaused(400)
    ends, late, _ = await paused_run(server, ("/pause_generation", {"content": b""}), whole_runs)
    for end, whole in zip(ends, whole_runs):
        assert end["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(end["output_ids"]) < 400
        assert end["output_ids"] == whole["output_ids"][: len(end["output_ids"])]
    assert late["output_ids"] == whole_runs[-1]["output_ids"]


async def test_vllm_abort_ends_requests_with_their_partial_tokens(server, unpaused):
    whole_runs = await unpaused(400)
    ends, late, _ = await paused_run(server, ("/pause", {}), whole_runs)  # vLLM's default mode
    for end, whole in zip(ends, whole_runs):
        assert end["meta_info"]["finish_reason"]["type"] == "abort"
        assert end["output_ids"] == whole["output_ids"][: len(end["output_ids"])]
    assert late["output_ids"] == whole_runs[-1]["output_ids"]


@pytest.mark.parametrize("wait", [{"mode": "wait"}, {"wait_for_inflight_requests": "true"}], ids=["mode", "older"])
async def test_vllm_wait_finishes_what_runs_and_holds_the_rest(server, wait):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        started = [asyncio.Event() for _ in PROMPTS]
        # Long enough (a second or more) to be running still when the pause comes.
        streams = [asyncio.create_task(streamed(http, body(p, 300, True), e)) for p, e in zip(PROMPTS, started)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        assert not any(stream.done() for stream in streams)
        paused = await http.post("/pause", params=wait)
        assert paused.status_code == 200 and paused.json()["status"] == "paused"
        assert paused.json()["held"] == 0  # it answered once nothing ran
        try:
            late = asyncio.create_task(http.post("/generate", json=body(LATE, 8)))
            await asyncio.sleep(0.5)
            assert not late.done()
        finally:
            assert (await http.post("/resume")).json()["status"] == "resumed"
        assert [e["meta_info"]["finish_reason"]["type"] for e in await asyncio.gather(*streams)] == ["length"] * 3
        assert len((await late).json()["output_ids"]) == 8


def test_continue_without_a_pause_and_bad_modes_are_400(server):
    """SGLang's continue refuses what is not paused; vLLM's /resume answers it as vLLM does: 200."""
    url = server.base_url
    response = httpx.post(f"{url}/continue_generation", json={})
    assert response.status_code == 400 and "not paused" in response.json()["error"]["message"]
    resumed = httpx.post(f"{url}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "resumed", resumed.text
    response = httpx.post(f"{url}/pause_generation", json={"mode": "sideways"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "mode"
    assert httpx.post(f"{url}/pause", params={"mode": "retract"}).status_code == 400
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}
