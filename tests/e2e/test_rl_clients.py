"""RL trainers' own SGLang calls against the real server: slime's, AReaL's, verl's and SkyRL's
requests and reads (tests/e2e/slime_client.py and rl_clients.py) generate with logprobs, abort and
resubmit, batch, score, and poll health, and the logprobs they collect are what a trainer
recomputes."""

import asyncio
import math

import aiohttp
import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.e2e.rl_clients import (
    ArealClient,
    areal_request,
    skyrl_generate,
    skyrl_sampling_params,
    verl_generate_payload,
    verl_post,
    verl_token_output,
)
from tests.e2e.slime_client import (
    SLIME_HEALTH_HEADERS,
    SlimeSample,
    slime_abort_until_idle,
    slime_generate,
    slime_generate_streaming,
    slime_http,
    slime_num_requests,
    slime_sampling_params,
    slime_server_info,
    slime_teacher_log_probs,
)

TOLERANCE = 1e-4  # float32 on the CPU: the server against transformers (docs/api.md)


@pytest.fixture(scope="module")
def tokenizer(server):
    return AutoTokenizer.from_pretrained(server.model_dir)


@pytest.fixture(scope="module")
def trainer_log_probs(server):
    """What a trainer recomputes: log_softmax of the model's raw logits, token t from position t-1."""
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32).eval()

    def log_probs(tokens: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0, :-1]  # [len - 1, vocab]
        return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0].tolist()

    return log_probs


def prompt_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)  # as slime's _prepare_prompt_ids


def assert_sglang_logprob_entries(meta: dict, output_ids: list[int]) -> None:
    """Every output token has one [logprob, token_id, text or null] entry, as SGLang gives them."""
    entries = meta["output_token_logprobs"]
    assert len(entries) == len(output_ids) == meta["completion_tokens"]
    for entry, token in zip(entries, output_ids):
        assert len(entry) == 3 and entry[1] == token and (entry[2] is None or isinstance(entry[2], str))
        assert math.isfinite(entry[0]) and entry[0] <= 0


async def wait_until_generating(http: httpx.AsyncClient, base_url: str, tokens_s: float = 0.2) -> None:
    """Until a request runs, then `tokens_s` more, so an abort lands mid-generation: a few tokens on
    a busy CPU, a hundred on an idle one, far from the budgets below."""
    for _ in range(200):
        load = (await http.get(f"{base_url}/v1/loads?include=core")).json()
        if sum(entry["num_running_reqs"] for entry in load["loads"]) >= 1:
            await asyncio.sleep(tokens_s)
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("no request started running")


async def test_slime_rollout_logprobs_are_what_the_trainer_recomputes(server, tokenizer, trainer_log_probs):
    prompt = prompt_ids(tokenizer, "Once upon a time")
    sample = SlimeSample(list(prompt))
    async with slime_http() as http:
        output = await slime_generate(http, server.base_url, sample, slime_sampling_params(24))
        teacher = await slime_teacher_log_probs(http, server.base_url, sample)
    meta = output["meta_info"]
    assert_sglang_logprob_entries(meta, output["output_ids"])
    assert meta["prompt_tokens"] == len(prompt) and isinstance(meta["id"], str)
    assert sample.status in ("completed", "truncated") and 0 < sample.response_length <= 24
    assert sample.tokens == prompt + output["output_ids"]
    assert teacher == sample.rollout_log_probs  # teacher forcing: exactly, on the CPU
    reference = trainer_log_probs(sample.tokens)[-sample.response_length :]
    assert sample.rollout_log_probs == pytest.approx(reference, abs=TOLERANCE)


async def test_scoring_with_no_new_tokens_gives_every_prompt_position(server, tokenizer, trainer_log_probs):
    prompt = prompt_ids(tokenizer, "The river runs to the sea")
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    async with slime_http() as http:
        reply = (await http.post(f"{server.base_url}/generate", json=body)).json()
    meta = reply["meta_info"]
    assert reply["output_ids"] == [] and meta["completion_tokens"] == 0 and meta["output_token_logprobs"] == []
    assert meta["finish_reason"]["type"] == "length"
    entries = meta["input_token_logprobs"]
    assert [entry[1] for entry in entries] == prompt
    assert entries[0][0] is None  # the first token has nothing before it
    assert [entry[0] for entry in entries[1:]] == pytest.approx(trainer_log_probs(prompt), abs=TOLERANCE)


async def test_slime_partial_rollout_aborts_then_resubmits_prompt_plus_partial(server, tokenizer, trainer_log_probs):
    budget = 2000
    params = slime_sampling_params(budget, ignore_eos=True)  # the random model would stop anywhere
    sample = SlimeSample(prompt_ids(tokenizer, "A long story begins"))
    async with slime_http() as http:
        async with asyncio.TaskGroup() as tasks:
            rollout = tasks.create_task(slime_generate(http, server.base_url, sample, params))
            await wait_until_generating(http, server.base_url)
            await slime_abort_until_idle(http, server.base_url)
        aborted = rollout.result()
        partial = sample.response_length
        assert aborted["meta_info"]["finish_reason"]["type"] == "abort" and sample.status == "aborted"
        assert 0 < partial < budget
        assert_sglang_logprob_entries(aborted["meta_info"], aborted["output_ids"])
        resumed = await slime_generate(http, server.base_url, sample, params)
        assert resumed["meta_info"]["prompt_tokens"] == len(sample.tokens) - (budget - partial)
        teacher = await slime_teacher_log_probs(http, server.base_url, sample)
    assert sample.status == "truncated" and sample.response_length == budget == len(sample.rollout_log_probs)
    assert teacher == sample.rollout_log_probs  # teacher forcing: exactly, on the CPU
    assert sample.rollout_log_probs == pytest.approx(trainer_log_probs(sample.tokens)[-budget:], abs=TOLERANCE)


async def test_slime_streaming_rollout_reads_cumulative_chunks(server, tokenizer):
    params = slime_sampling_params(16, temperature=0.0, ignore_eos=True)
    whole, streamed = SlimeSample(prompt_ids(tokenizer, "The cat")), SlimeSample(prompt_ids(tokenizer, "The cat"))
    async with slime_http() as http:
        await slime_generate(http, server.base_url, whole, params)
        chunks = await slime_generate_streaming(http, server.base_url, streamed, params)
    assert len(chunks) > 1
    for earlier, later in zip(chunks, chunks[1:]):  # each chunk holds everything so far
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]
        assert later["text"].startswith(earlier["text"])
    assert [c["meta_info"]["finish_reason"] is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert (streamed.tokens, streamed.response, streamed.status) == (whole.tokens, whole.response, whole.status)
    assert streamed.rollout_log_probs == pytest.approx(whole.rollout_log_probs, abs=TOLERANCE)


async def test_slime_streaming_rollout_aborted_keeps_what_streamed(server, tokenizer, trainer_log_probs):
    params = slime_sampling_params(2000, ignore_eos=True)
    sample = SlimeSample(prompt_ids(tokenizer, "Once there was"))
    async with slime_http() as http:
        async with asyncio.TaskGroup() as tasks:
            rollout = tasks.create_task(slime_generate_streaming(http, server.base_url, sample, params))
            await wait_until_generating(http, server.base_url)
            await slime_abort_until_idle(http, server.base_url)
        last = rollout.result()[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort" and sample.status == "aborted"
    assert 0 < sample.response_length == len(last["output_ids"]) == len(sample.rollout_log_probs) < 2000
    reference = trainer_log_probs(sample.tokens)[-sample.response_length :]
    assert sample.rollout_log_probs == pytest.approx(reference, abs=TOLERANCE)


async def test_slime_health_info_and_load_polls(server):
    async with slime_http() as http:
        health = await http.get(f"{server.base_url}/health_generate", headers=SLIME_HEALTH_HEADERS)
        assert health.status_code == 200
        info = await slime_server_info(http, server.base_url)
        assert isinstance(info, dict)
        load = await http.get(f"{server.base_url}/v1/loads?include=core")
        assert load.headers["content-type"].startswith("application/json")
        assert all(isinstance(e["num_running_reqs"], int) for e in load.json()["loads"])
        assert slime_num_requests(load.json()) == 0
        for route in ("/get_model_info", "/model_info", "/get_load", "/health"):
            response = await http.get(f"{server.base_url}{route}")
            assert response.status_code == 200, route
        assert "model_path" in (await http.get(f"{server.base_url}/get_model_info")).json()


async def test_areal_rollout_survives_interruptions(server, tokenizer, trainer_log_probs):
    prompt, budget = prompt_ids(tokenizer, "In the beginning"), 2000
    async with aiohttp.ClientSession() as session, slime_http() as http:
        client = ArealClient(session, server.base_url)
        assert await client.check_health()
        async with asyncio.TaskGroup() as tasks:
            rollout = tasks.create_task(client.agenerate(prompt, budget, ignore_eos=True))
            await wait_until_generating(http, server.base_url)
            # A trainer's weight update aborts every request (SGLang's abort_all_requests).
            abort = {"rid": "", "abort_all": True}
            (await http.post(f"{server.base_url}/abort_request", json=abort)).raise_for_status()
        result = rollout.result()
    assert result.attempts[0][1] == "abort" and 0 < result.attempts[0][0] < budget
    assert result.attempts[-1][1] == "length" and len(result.attempts) >= 2
    assert result.stop_reason == "length" and len(result.output_tokens) == len(result.output_logprobs) == budget
    reference = trainer_log_probs(prompt + result.output_tokens)[-budget:]
    assert result.output_logprobs == pytest.approx(reference, abs=TOLERANCE)


async def test_verl_top_and_asked_token_logprobs(server, tokenizer):
    prompt = prompt_ids(tokenizer, "Rivers and mountains")
    asked = sorted(set(prompt))[:3]
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "max_new_tokens": 6}
    body = verl_generate_payload(
        input_ids=prompt,
        sampling_params=sampling,
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
        token_ids_logprob=asked,
    )
    async with aiohttp.ClientSession() as session:
        output = await verl_post(session, f"{server.base_url}/generate", body)
    tokens, log_probs = verl_token_output(output)
    meta = output["meta_info"]
    assert tokens == output["output_ids"] and len(meta["output_top_logprobs"]) == len(tokens)
    positions = zip(tokens, log_probs, meta["output_top_logprobs"], meta["output_token_ids_logprobs"])
    for token, log_prob, top, by_id in positions:
        assert len(top) == 3 and [entry[0] for entry in top] == sorted([entry[0] for entry in top], reverse=True)
        assert top[0][1] == token and top[0][0] == pytest.approx(log_prob, abs=TOLERANCE)  # greedy: the most likely
        assert [entry[1] for entry in by_id] == asked
    assert len(meta["input_token_logprobs"]) == len(meta["input_top_logprobs"]) == len(prompt)
    assert meta["input_top_logprobs"][0] is None and all(len(top) == 3 for top in meta["input_top_logprobs"][1:])


async def test_abort_by_rid_ends_that_request_alone(server, tokenizer):
    prompt = prompt_ids(tokenizer, "Two roads")
    sampling = {"temperature": 1.0, "top_k": -1, "max_new_tokens": 1500, "ignore_eos": True}

    def body(rid: str) -> dict:  # async_sglang_server's request: the rid is the client's own
        return {"rid": rid, **verl_generate_payload(input_ids=prompt, sampling_params=sampling, return_logprob=True)}

    async with aiohttp.ClientSession() as session, slime_http() as http:
        async with asyncio.TaskGroup() as tasks:
            doomed = tasks.create_task(verl_post(session, f"{server.base_url}/generate", body("doomed-1")))
            kept = tasks.create_task(verl_post(session, f"{server.base_url}/generate", body("kept-1")))
            await wait_until_generating(http, server.base_url)
            await verl_post(session, f"{server.base_url}/abort_request", {"rid": "doomed-1", "abort_all": False})
        aborted, finished = doomed.result(), kept.result()
    assert aborted["meta_info"]["id"] == "doomed-1" and aborted["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(aborted["output_ids"]) < 1500
    assert_sglang_logprob_entries(aborted["meta_info"], aborted["output_ids"])
    assert finished["meta_info"]["finish_reason"]["type"] == "length" and len(finished["output_ids"]) == 1500


async def test_abort_request_answers_200_with_nothing_running(server):
    async with slime_http() as http:
        for body in ({"abort_all": True}, {"rid": "", "abort_all": True}, {"rid": "never-sent"}):
            assert (await http.post(f"{server.base_url}/abort_request", json=body)).status_code == 200, body


async def test_skyrl_batch_generate_is_the_single_requests(server, tokenizer):
    prompts = [prompt_ids(tokenizer, text) for text in ("Once", "The old man", "Stars")]
    params = skyrl_sampling_params(8, temperature=0.0)
    batch_ids, batch_finishes = await skyrl_generate(server.base_url, prompts, params)
    singles = [await skyrl_generate(server.base_url, [prompt], params) for prompt in prompts]
    assert batch_ids == [ids[0] for ids, _ in singles]
    assert batch_finishes == [finishes[0] for _, finishes in singles]
    assert all(finish in ("stop", "length") for finish in batch_finishes)


async def test_batch_with_logprobs_is_a_list_in_prompt_order(server, tokenizer):
    prompts = [prompt_ids(tokenizer, text) for text in ("Alpha beta", "Gamma")]
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 5, "temperature": 0.0}, "return_logprob": True}
    async with aiohttp.ClientSession() as session:
        replies = await areal_request(session, f"{server.base_url}/generate", body)
    assert isinstance(replies, list) and len(replies) == 2
    assert [reply["meta_info"]["prompt_tokens"] for reply in replies] == [len(p) for p in prompts]
    assert len({reply["meta_info"]["id"] for reply in replies}) == 2
    for reply in replies:
        assert_sglang_logprob_entries(reply["meta_info"], reply["output_ids"])


async def test_sglang_sampling_controls_reach_the_draw(server, tokenizer):
    """SGLang's names for the per-token controls: a stop token made near certain by its bias is held
    off by min_new_tokens, then ends the request as the stop SGLang reports."""
    prompt = prompt_ids(tokenizer, "Count with me")
    stop, other = 7, 8
    sampling = {
        "max_new_tokens": 16,
        "temperature": 1.0,
        "top_k": -1,
        "min_new_tokens": 3,
        "stop_token_ids": [stop],
        "logit_bias": {str(stop): 100.0, str(other): 50.0},
        "allowed_token_ids": [stop, other],
    }
    body = {"input_ids": prompt, "sampling_params": sampling, "return_logprob": True}
    async with aiohttp.ClientSession() as session:
        reply = await verl_post(session, f"{server.base_url}/generate", body)
    assert reply["output_ids"] == [other, other, other, stop]
    assert reply["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert_sglang_logprob_entries(reply["meta_info"], reply["output_ids"])  # raw: the controls aside
