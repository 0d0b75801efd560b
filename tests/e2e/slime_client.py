"""slime's SGLang client, reproduced: what its rollout sends to an SGLang server and how it reads
the replies, written from slime's source (the files below; docs/journal/2026-11-26-rl-clients.md
has the notes). Our code, not theirs: same bodies, headers, routes and reads, without slime around
them."""

import asyncio
import json
import uuid
from dataclasses import dataclass, field

import httpx

# slime: slime/rollout/sglang_rollout.py (GenerateState, generate, abort),
# slime/rollout/sglang_streaming_rollout.py, slime/rollout/on_policy_distillation.py,
# slime/utils/types.py (Sample.append_response_tokens), slime/backends/sglang_utils/server_control.py,
# slime/backends/sglang_utils/sglang_engine.py and external.py (health, server info).

SLIME_STATUS = {"length": "truncated", "abort": "aborted", "stop": "completed"}


@dataclass
class SlimeSample:
    """slime's Sample, the fields a rollout touches: `tokens` is the prompt, then the response."""

    tokens: list[int]
    response: str = ""
    response_length: int = 0
    rollout_log_probs: list[float] = field(default_factory=list)
    status: str = "pending"
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))


def slime_sampling_params(max_new_tokens: int, **overrides) -> dict:
    """GenerateState's dict with slime's argument defaults (top_k -1, stop and stop_token_ids null);
    `overrides` stand for a rollout's other settings (temperature, a custom generate's keys)."""
    params = dict(
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=max_new_tokens,
        stop=None,
        stop_token_ids=None,
        skip_special_tokens=False,
        no_stop_trim=True,
        spaces_between_special_tokens=False,
    )
    return params | overrides


def slime_http() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(None), trust_env=False)


def _slime_append(sample: SlimeSample, text: str, entries: list, meta: dict) -> None:
    """append_response_tokens: tokens are item[1], logprobs item[0]; the status from finish_reason."""
    tokens, log_probs = [item[1] for item in entries], [item[0] for item in entries]
    if len(log_probs) != len(tokens):
        raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
    sample.tokens = sample.tokens + tokens
    sample.response += text
    sample.response_length += len(tokens)
    sample.rollout_log_probs = sample.rollout_log_probs + log_probs
    if meta.get("finish_reason"):
        sample.status = SLIME_STATUS[meta["finish_reason"]["type"]]


async def slime_generate(http: httpx.AsyncClient, base_url: str, sample: SlimeSample, sampling_params: dict) -> dict:
    """One rollout request; an aborted sample comes back with prompt + partial response as its
    input and the rest of the budget (partial rollout). Returns SGLang's reply as read."""
    params = dict(sampling_params)
    params["max_new_tokens"] -= sample.response_length
    if params["max_new_tokens"] == 0:
        sample.status = "truncated"
        return {}
    payload = {"sampling_params": params, "return_logprob": True, "input_ids": sample.tokens}
    headers = {"X-SMG-Routing-Key": sample.session_id}  # the router's consistent hashing
    response = await http.post(f"{base_url}/generate", json=payload, headers=headers)
    response.raise_for_status()
    output = response.json()
    meta = output["meta_info"]
    _slime_append(sample, output["text"], meta.get("output_token_logprobs", []), meta)
    return output


async def slime_generate_streaming(
    http: httpx.AsyncClient, base_url: str, sample: SlimeSample, sampling_params: dict
) -> list[dict]:
    """generate_streaming: each SSE chunk is cumulative, so the call's tokens are replaced by the
    latest chunk's, never extended (slime rebuilds the sample at every chunk; here once, at the
    end). Returns every chunk read."""
    params = dict(sampling_params)
    params["max_new_tokens"] -= sample.response_length
    payload = {"sampling_params": params, "return_logprob": True, "stream": True, "input_ids": sample.tokens}
    chunks, call_text, call_entries, last_meta = [], "", [], {}
    async with http.stream("POST", f"{base_url}/generate", json=payload) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            chunks.append(chunk)
            last_meta = chunk.get("meta_info") or {}
            call_text = chunk.get("text", call_text)
            call_entries = last_meta.get("output_token_logprobs", call_entries)
    _slime_append(sample, call_text, call_entries, last_meta)
    return chunks


def slime_num_requests(load) -> int:
    """num_requests_from_load: the first request count a load report has, summed over lists."""
    if isinstance(load, list):
        return sum(slime_num_requests(item) for item in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return slime_num_requests(load["loads"])
    for key in ("num_reqs", "num_total_reqs", "total_reqs"):
        if isinstance(load.get(key), int):
            return load[key]
    running, waiting = load.get("num_running_reqs"), load.get("num_waiting_reqs")
    return (running if isinstance(running, int) else 0) + (waiting if isinstance(waiting, int) else 0)


async def slime_abort_until_idle(http: httpx.AsyncClient, base_url: str, retry_interval_s: float = 0.2) -> int:
    """abort_server_until_idle: abort everything, then poll the load until no request is left.
    Returns the number of abort calls it took (slime waits 3 s between them)."""
    attempts = 1
    while True:
        (await http.post(f"{base_url}/abort_request", json={"abort_all": True})).raise_for_status()
        load = await http.get(f"{base_url}/v1/loads?include=core")
        load.raise_for_status()
        if slime_num_requests(load.json()) <= 0:
            return attempts
        await asyncio.sleep(retry_interval_s)
        attempts += 1


async def slime_teacher_log_probs(http: httpx.AsyncClient, base_url: str, sample: SlimeSample) -> list[float]:
    """on_policy_distillation's reward_func + post_process_rewards: the whole sequence scored with
    max_new_tokens 0 from position 0; the first (null) entry dropped, the response's kept."""
    payload = {
        "input_ids": sample.tokens,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    response = await http.post(f"{base_url}/generate", json=payload)
    response.raise_for_status()
    teacher = [item[0] for item in response.json()["meta_info"]["input_token_logprobs"][1:]]
    return teacher[-sample.response_length :]


SLIME_HEALTH_HEADERS = {"Content-Type": "application/json; charset=utf-8", "Authorization": "Bearer None"}


async def slime_server_info(http: httpx.AsyncClient, base_url: str) -> dict:
    """external.get_server_info: /server_info, else /get_server_info."""
    errors = []
    for route in ("/server_info", "/get_server_info"):
        response = await http.get(f"{base_url}{route}")
        if response.status_code == 200:
            return response.json()
        errors.append(f"{route}: {response.status_code}")
    raise RuntimeError(f"no server info: {errors}")
