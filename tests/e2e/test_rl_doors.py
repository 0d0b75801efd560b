"""The doors RL clients use, through a real server: OpenAI's logprobs read by the `openai` SDK with
no adapter (whole and streamed), vLLM's extras, SGLang's native /generate (one prompt, a batch, a
stream, scoring with max_new_tokens 0), /abort_request with the partial output, the health, info
and load routes, and bad input named while the server keeps serving."""

import asyncio
import json
import time

import httpx
import pytest

PROMPT_IDS = [12, 40, 7, 99, 31, 64, 5, 250]
GREEDY = {"temperature": 0, "ignore_eos": True}


def sglang(server, **body) -> dict | list:
    response = httpx.post(f"{server.base_url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    return response.json()


def events(lines: list[str]) -> list[dict]:
    lines = [line for line in lines if line]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]


# --- OpenAI, through the SDK --------------------------------------------------------------------


def test_chat_logprobs_whole_and_streamed(client):
    asked = dict(model="demo", messages=[{"role": "user", "content": "Count to five."}], max_tokens=8)
    asked |= dict(temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    started = int(time.time())
    whole = client.chat.completions.create(**asked)
    assert started <= whole.created <= time.time() + 1  # the request's time, not the server's start
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 8
    for entry in content:
        assert len(entry.top_logprobs) == 3
        tops = [top.logprob for top in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True) and all(lp <= 0 for lp in tops)
        assert entry.logprob == pytest.approx(tops[0])  # greedy draws the most likely
        assert entry.bytes == list(entry.token.encode())
    chunks = list(client.chat.completions.create(**asked, stream=True))
    streamed = [
        entry
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


def test_completion_logprobs_with_echo_whole_and_streamed(client):
    asked = dict(model="demo", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=2, echo=True)
    asked |= dict(extra_body={"ignore_eos": True})
    whole = client.completions.create(**asked)
    choice = whole.choices[0]
    logprobs = choice.logprobs
    assert choice.text.startswith("Once upon a time")
    assert len(logprobs.tokens) == whole.usage.prompt_tokens + whole.usage.completion_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp is not None and lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(1 <= len(top) <= 3 for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    chunks = list(client.completions.create(**asked, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    streamed_tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    streamed_logprobs = [
        lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed_tokens == logprobs.tokens and streamed_logprobs == logprobs.token_logprobs


def test_vllm_prompt_logprobs_and_token_ids(client):
    reply = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        extra_body={"ignore_eos": True, "prompt_logprobs": 1, "return_token_ids": True},
    )
    extra = reply.model_extra
    assert len(extra["prompt_token_ids"]) == reply.usage.prompt_tokens
    assert extra["prompt_logprobs"][0] is None and len(extra["prompt_logprobs"]) == reply.usage.prompt_tokens
    for token_id, position in zip(extra["prompt_token_ids"][1:], extra["prompt_logprobs"][1:]):
        assert str(token_id) in position and position[str(token_id)]["logprob"] <= 0
    assert len(reply.choices[0].model_extra["token_ids"]) == 4


# --- SGLang's /generate -------------------------------------------------------------------------


def test_generate_with_logprobs_matches_the_openai_door(server, client):
    body = {
        "input_ids": PROMPT_IDS,
        "sampling_params": {"max_new_tokens": 6, **GREEDY},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
        "rid": "logprobs-1",
    }
    reply = sglang(server, **body)
    meta = reply["meta_info"]
    assert meta["id"] == "logprobs-1" and meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(PROMPT_IDS), 6)
    inputs, outputs = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert [entry[1] for entry in inputs] == PROMPT_IDS and inputs[0][0] is None
    assert [entry[1] for entry in outputs] == reply["output_ids"]
    assert all(len(entry) == 3 and entry[0] <= 0 and isinstance(entry[2], str) for entry in inputs[1:] + outputs)
    assert meta["input_top_logprobs"][0] is None and all(len(top) == 2 for top in meta["output_top_logprobs"])
    completion = client.completions.create(model="demo", prompt=PROMPT_IDS, max_tokens=6, logprobs=0, **_greedy())
    assert completion.choices[0].logprobs.token_logprobs == pytest.approx([entry[0] for entry in outputs], abs=1e-6)


def _greedy() -> dict:
    return {"temperature": 0, "extra_body": {"ignore_eos": True}}


def test_a_batch_answers_a_list_in_order(server):
    replies = sglang(
        server,
        text=["The sea", "A red fox", "Numbers:"],
        rid=["b0", "b1", "b2"],
        sampling_params=[{"max_new_tokens": n, **GREEDY} for n in (1, 2, 3)],
    )
    assert [r["meta_info"]["id"] for r in replies] == ["b0", "b1", "b2"]
    assert [len(r["output_ids"]) for r in replies] == [1, 2, 3]
    alone = sglang(server, text="A red fox", sampling_params={"max_new_tokens": 2, **GREEDY})
    assert alone["output_ids"] == replies[1]["output_ids"]


def test_scoring_with_max_new_tokens_0_gives_back_the_rollouts_logprobs(server):
    """Teacher forcing: the finished sequence sent back as a prompt scores its output tokens as the
    rollout did."""
    rollout = sglang(server, input_ids=PROMPT_IDS, sampling_params={"max_new_tokens": 6, **GREEDY}, return_logprob=True)
    sequence = PROMPT_IDS + rollout["output_ids"]
    scored = sglang(
        server,
        input_ids=sequence,
        sampling_params={"max_new_tokens": 0, "temperature": 0},
        return_logprob=True,
        logprob_start_len=len(PROMPT_IDS),
    )
    assert scored["output_ids"] == [] and scored["meta_info"]["finish_reason"]["type"] == "length"
    inputs = scored["meta_info"]["input_token_logprobs"]
    assert [entry[1] for entry in inputs] == rollout["output_ids"]
    wanted = [entry[0] for entry in rollout["meta_info"]["output_token_logprobs"]]
    assert [entry[0] for entry in inputs] == pytest.approx(wanted, abs=1e-5)


async def test_a_stream_repeats_everything_so_far(server):
    body = {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 5, **GREEDY}, "return_logprob": True}
    whole = sglang(server, **body)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        async with http.stream("POST", "/generate", json=body | {"stream": True}) as response:
            lines = [line async for line in response.aiter_lines()]
    streamed = events(lines)
    assert streamed[-1]["output_ids"] == whole["output_ids"] and streamed[-1]["text"] == whole["text"]
    assert all(e["meta_info"]["finish_reason"] is None for e in streamed[:-1])
    last = streamed[-1]["meta_info"]
    assert last["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"]


async def test_abort_request_ends_requests_with_their_partial_output(server):
    long = {"sampling_params": {"max_new_tokens": 2000, **GREEDY}, "return_logprob": True}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        async with http.stream(
            "POST", "/generate", json={"input_ids": PROMPT_IDS, "rid": "to-abort", "stream": True} | long
        ) as response:
            lines = response.aiter_lines()
            seen = [line async for line in _until_tokens(lines)]
            aborted = await http.post("/abort_request", json={"rid": "to-abort"})
            seen += [line async for line in lines]
        assert aborted.status_code == 200
        last = events(seen)[-1]
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(last["output_ids"]) < 2000
        assert len(last["meta_info"]["output_token_logprobs"]) == len(last["output_ids"])
        # Every request at once, in either of the forms RL clients send.
        for body in ({"abort_all": True}, {"rid": "", "abort_all": True}):
            running = asyncio.create_task(http.post("/generate", json={"text": "Go on:"} | long))
            await asyncio.sleep(1.0)
            assert (await http.post("/abort_request", json=body)).status_code == 200
            reply = await running
            assert reply.status_code == 200 and reply.json()["meta_info"]["finish_reason"]["type"] == "abort"
            assert len(reply.json()["output_ids"]) < 2000


async def _until_tokens(lines):
    async for line in lines:
        yield line
        if line.startswith("data: {") and json.loads(line.removeprefix("data: "))["output_ids"]:
            return


# --- health, info, load -------------------------------------------------------------------------


def test_health_info_and_load_routes(server):
    headers = {"Authorization": "Bearer not-configured", "X-SMG-Routing-Key": "worker-3"}

    def get(path: str) -> httpx.Response:
        response = httpx.get(f"{server.base_url}{path}", headers=headers, timeout=60)
        assert response.status_code == 200, (path, response.text)
        return response

    get("/health")
    get("/health_generate")
    for path in ("/server_info", "/get_server_info"):
        info = get(path).json()
        assert info["max_total_num_tokens"] > 0 and info["internal_states"][0]["num_running_reqs"] >= 0
    for path in ("/model_info", "/get_model_info"):
        model = get(path).json()
        assert model["is_generation"] is True and model["model_path"] and model["tokenizer_path"]
    loads = get("/v1/loads?include=core").json()
    (load,) = loads["loads"]
    assert {"num_running_reqs", "num_waiting_reqs", "num_used_tokens", "token_usage"} <= set(load)
    (legacy,) = get("/get_load").json()
    assert {"num_reqs", "num_waiting_reqs", "num_tokens"} <= set(legacy)


# --- bad input ----------------------------------------------------------------------------------

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", CHAT | {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/completions", {"model": "demo", "prompt": "x", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"model": "demo", "prompt": "x", "logit_bias": {"ten": 1}}, "logit_bias"),
        ("/v1/completions", {"model": "demo", "prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias"),
        ("/v1/chat/completions", CHAT | {"allowed_token_ids": []}, "allowed_token_ids"),
        ("/v1/chat/completions", CHAT | {"allowed_token_ids": [99999999]}, "allowed_token_ids"),
        ("/v1/chat/completions", CHAT | {"stop_regex": "(open"}, "stop_regex"),
        ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
        ("/generate", {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len"),
        ("/generate", {"text": "x y", "return_logprob": True, "logprob_start_len": 500}, "logprob_start_len"),
        ("/generate", {"text": "x", "sampling_params": {"stop_regex": "[b-a]"}}, "sampling_params.stop_regex"),
    ],
)
def test_bad_input_names_the_field_and_the_server_keeps_serving(server, path, body, param):
    response = httpx.post(f"{server.base_url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()
    assert sglang(server, text="still there?", sampling_params={"max_new_tokens": 2})["output_ids"]


def test_processed_logprobs_on_request_at_both_doors(client, server):
    """With top_k 1 only the drawn token survives the filters: its processed logprob is 0 and every
    other token's -inf (written -9999.0 on OpenAI's routes, as vLLM writes it); raw ones are not."""
    asked = dict(model="demo", prompt="Once upon a time", max_tokens=4, temperature=0.7, seed=3, logprobs=2)
    raw = client.completions.create(**asked, extra_body={"top_k": 1, "ignore_eos": True})
    processed = client.completions.create(
        **asked, extra_body={"top_k": 1, "ignore_eos": True, "logprobs_mode": "processed_logprobs"}
    )
    assert processed.choices[0].text == raw.choices[0].text  # the same draws
    assert processed.choices[0].logprobs.token_logprobs == [0.0] * 4
    assert all(lp < 0 for lp in raw.choices[0].logprobs.token_logprobs)
    for tops in processed.choices[0].logprobs.top_logprobs:
        assert sorted(tops.values()) == [-9999.0, 0.0]
    sampling = {"max_new_tokens": 4, "temperature": 0.7, "top_k": 1, "seed": 3, "ignore_eos": True}
    reply = sglang(
        server,
        input_ids=PROMPT_IDS,
        return_logprob=True,
        sampling_params=sampling | {"logprobs_mode": "processed_logprobs"},
    )
    assert [entry[0] for entry in reply["meta_info"]["output_token_logprobs"]] == [0.0] * 4
