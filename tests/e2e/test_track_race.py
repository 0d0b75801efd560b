"""An origin sends a request's Track and its Submit at once. A tokenizer that stalls while another
request streams finds in its socket a step of that request, then the Track, then the new request's
first step, and serves the steps first: the request must still complete, with the tokens it would
have had without the stall."""

import asyncio
import os
import signal

import httpx

from kernel import bus_auth
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.step import StepOutput

PROMPT_IDS = [5, 17, 42, 99, 7, 256, 31, 64]
# The tokenizer stays stopped for at most 2 x 0.8 + 2 x 0.1 s: with up to a second since its last
# heartbeat, under the three seconds of silence after which an actor counts as stuck.
STEP_TIMEOUT_S = 0.8
SETTLE_S = 0.1


async def generate(http: httpx.AsyncClient) -> list[int]:
    body = {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
    response = await http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()["output_ids"]


async def watch_steps(server) -> tuple[Bus, asyncio.Queue[StepOutput]]:
    """Step outputs as a tokenizer receives them (with the tokenizer's credentials)."""
    credentials = bus_auth.load_credentials(bus_auth.credentials_path(server.data_dir, "tokenizer"))
    bus = await Bus.connect(server.nats_url, "track-race-probe", credentials)
    steps: asyncio.Queue[StepOutput] = asyncio.Queue()

    async def collect(step: StepOutput, _reply_to: str | None) -> None:
        steps.put_nowait(step)

    await bus.subscribe(Subjects().step_outputs, StepOutput, collect)
    return bus, steps


async def next_step(steps: asyncio.Queue[StepOutput], starts_a_run: bool) -> None:
    while True:
        step = await asyncio.wait_for(steps.get(), STEP_TIMEOUT_S)
        if not starts_a_run or any(update.cached_tokens is not None for update in step.updates):
            return


async def test_outputs_that_overtake_the_track_are_not_lost(server):
    tokenizer = server.child_pid("tokenizer")
    bus, steps = await watch_steps(server)
    body = {"model": "demo", "prompt": "A long story:", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            reference = await generate(http)
            async with http.stream("POST", "/v1/completions", json=body) as streaming:
                lines = streaming.aiter_lines()
                for _ in range(4):  # it decodes
                    await anext(lines)
                os.kill(tokenizer, signal.SIGSTOP)
                try:
                    await asyncio.sleep(SETTLE_S)  # steps sent before the stop may have been read: skip them
                    while not steps.empty():
                        steps.get_nowait()
                    await next_step(steps, starts_a_run=False)  # a step of the stream waits in the tokenizer's socket,
                    late = asyncio.create_task(generate(http))  # then the new request's Track,
                    await next_step(steps, starts_a_run=True)  # then its first step
                    await asyncio.sleep(SETTLE_S)  # which the nats-server has also written to the tokenizer
                finally:
                    os.kill(tokenizer, signal.SIGCONT)
                assert await late == reference
    finally:
        await bus.close()
    assert server.find("request_migrating", reason="its first outputs overtook the track")
