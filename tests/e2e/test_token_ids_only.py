"""`detokenize: false` on the native `/generate`: token ids out and no text, taken by the origin from
the executor's step outputs, with no tokenizer on the way."""

import asyncio
import json
import os
import signal

import httpx

PROMPT_IDS = [5, 17, 42, 99, 7, 256, 31, 64]
# The tokenizer stays stopped for at most this long: under the three seconds of silence after which
# an actor counts as stuck and is restarted.
STOPPED_S = 1.5


def body(**sampling) -> dict:
    return {
        "input_ids": PROMPT_IDS,
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True, **sampling},
    }


async def test_the_same_tokens_without_text(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with_text = (await http.post("/generate", json=body())).json()
        without = (await http.post("/generate", json=body(detokenize=False))).json()
        async with http.stream("POST", "/generate", json={**body(detokenize=False), "stream": True}) as response:
            lines = [line async for line in response.aiter_lines()]
    assert with_text["text"] and without["text"] == ""
    assert without["output_ids"] == with_text["output_ids"] and len(without["output_ids"]) == 12
    meta = without["meta_info"]
    assert (meta["completion_tokens"], meta["finish_reason"]) == (12, {"type": "length", "length": 12})
    streamed = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]
    # Each event repeats the tokens so far, as SGLang's do.
    assert streamed[-1]["output_ids"] == with_text["output_ids"]
    assert all(a["output_ids"] == b["output_ids"][: len(a["output_ids"])] for a, b in zip(streamed, streamed[1:]))
    assert all(event["text"] == "" for event in streamed)


async def test_served_while_the_tokenizer_is_stopped(server):
    """Fails where the tokens go through a tokenizer: none answers while it is stopped."""
    tokenizer = server.child_pid("tokenizer")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        reference = (await http.post("/generate", json=body(detokenize=False))).json()["output_ids"]
        os.kill(tokenizer, signal.SIGSTOP)
        try:
            response = await asyncio.wait_for(http.post("/generate", json=body(detokenize=False)), STOPPED_S)
        finally:
            os.kill(tokenizer, signal.SIGCONT)
    assert response.status_code == 200, response.text
    assert response.json()["output_ids"] == reference


async def test_stop_strings_need_text(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        response = await http.post("/generate", json=body(detokenize=False, stop=["."]))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "sampling_params.stop"  # SGLang's clients read error.message
