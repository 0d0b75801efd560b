"""RL trainers' SGLang clients, reproduced: the requests slime, AReaL, verl and SkyRL send to an
SGLang server during rollouts and the way they read the replies, written from their source (files
named at each client; docs/journal/2026-11-26-rl-clients.md has the notes). Our code, not theirs:
same bodies, headers, routes and reads, without their frameworks around them."""

import asyncio
import json
import uuid
from dataclasses import dataclass, field

import aiohttp
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


# AReaL: areal/engine/sglang_remote.py (SGLangBackend), areal/infra/remote_inf_engine.py (agenerate,
# check_health, pause_generation, continue_generation), areal/infra/utils/http.py (arequest_with_retry).


def areal_generation_payload(input_ids: list[int], max_new_tokens: int, ignore_eos: bool, greedy: bool = False) -> dict:
    """build_generation_request with GenerationHyperparameters' defaults (top_k int(1e8): off)."""
    sample_params = {
        "top_p": 1.0,
        "top_k": int(1e8),
        "max_new_tokens": max_new_tokens,
        "temperature": 0.0 if greedy else 1.0,
        "stop_token_ids": [],
        "ignore_eos": ignore_eos,
        "skip_special_tokens": True,
        "frequency_penalty": 0.0,
    }
    return {
        "input_ids": list(input_ids),
        "image_data": None,
        "sampling_params": sample_params,
        "return_logprob": True,
        "stream": False,
    }


def areal_parse(response: dict) -> tuple[list[int], list[float], str]:
    """parse_generation_response: (tokens, logprobs, stop reason)."""
    meta_info = response["meta_info"]
    stop_reason = meta_info["finish_reason"]["type"]
    if stop_reason == "abort" and meta_info["finish_reason"].get("message", "").startswith("Abort before prefill"):
        return [], [], stop_reason
    entries = meta_info["output_token_logprobs"]
    return [x[1] for x in entries], [x[0] for x in entries], stop_reason


async def areal_request(session: aiohttp.ClientSession, url: str, payload: dict | None = None, method: str = "POST"):
    """arequest_with_retry's read: JSON only for content type application/json, else text or bytes."""
    call = session.get(url) if method == "GET" else session.post(url, json=payload)
    async with call as response:
        response.raise_for_status()
        if response.content_type == "application/json":
            return await response.json()
        if (response.content_type or "").startswith("text/"):
            return await response.text()
        return await response.read()


@dataclass
class ArealResult:
    output_tokens: list[int]
    output_logprobs: list[float]
    stop_reason: str
    attempts: list[tuple[int, str]]  # (tokens, stop reason) of each request the loop sent


class ArealClient:
    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session, self.base_url, self.paused = session, base_url, False

    async def agenerate(self, input_ids: list[int], max_new_tokens: int, ignore_eos: bool = False) -> ArealResult:
        """The interruption loop: resubmit prompt + output so far with the budget left until a
        stop or length ends it; a last abort reads as length."""
        input_ids, budget = list(input_ids), max_new_tokens
        tokens, logprobs, attempts, stop_reason = [], [], [], None
        while stop_reason not in ("stop", "tool_calls", "length") and len(tokens) < max_new_tokens:
            while self.paused:
                await asyncio.sleep(0.05)
            payload = areal_generation_payload(input_ids, budget, ignore_eos)
            result = await areal_request(self.session, f"{self.base_url}/generate", payload)
            if not isinstance(result, dict):
                raise ValueError(f"Expected JSON dict response, got {type(result).__name__}")
            out_tokens, out_logprobs, stop_reason = areal_parse(result)
            attempts.append((len(out_tokens), stop_reason))
            tokens += out_tokens
            logprobs += out_logprobs
            input_ids += out_tokens
            budget -= len(out_tokens)
            if budget < 0:
                raise AssertionError(f"the server gave {-budget} tokens over max_new_tokens")
        return ArealResult(tokens, logprobs, "length" if stop_reason == "abort" else stop_reason, attempts)

    async def check_health(self) -> bool:
        async with self.session.get(f"{self.base_url}/health") as response:
            return response.status == 200

    async def pause_generation(self) -> None:
        self.paused = True
        await areal_request(self.session, f"{self.base_url}/pause_generation", {})

    async def continue_generation(self) -> None:
        await areal_request(self.session, f"{self.base_url}/continue_generation", {})
        self.paused = False


# verl: verl/workers/rollout/sglang_rollout/http_server_engine.py (AsyncHttpServerAdapter.generate,
# abort_request, _read_async_response) and async_sglang_server.py (the triples' unpacking).


def verl_generate_payload(**fields) -> dict:
    """generate's body: every argument it has, the null ones dropped (so false is sent)."""
    payload = {
        "text": fields.get("prompt"),
        "sampling_params": fields.get("sampling_params"),
        "input_ids": fields.get("input_ids"),
        "image_data": fields.get("image_data"),
        "return_logprob": fields.get("return_logprob", False),
        "logprob_start_len": fields.get("logprob_start_len"),
        "top_logprobs_num": fields.get("top_logprobs_num"),
        "token_ids_logprob": fields.get("token_ids_logprob"),
        "lora_path": fields.get("lora_path"),
        "custom_logit_processor": fields.get("custom_logit_processor"),
    }
    return {k: v for k, v in payload.items() if v is not None}


async def verl_post(session: aiohttp.ClientSession, url: str, payload: dict) -> dict:
    async with session.post(url, json=payload) as response:
        response.raise_for_status()
        if response.status == 204 or response.content_length == 0:
            return {}
        return await response.json(content_type=None)


def verl_token_output(output: dict) -> tuple[list[int], list[float]]:
    """(token ids, logprobs), unpacking each entry as an exact (log_prob, token_id, _) triple."""
    pairs = [(token_id, log_prob) for log_prob, token_id, _ in output["meta_info"]["output_token_logprobs"]]
    return [t for t, _ in pairs], [lp for _, lp in pairs]


# SkyRL: skyrl-train/skyrl_train/inference_engines/remote_inference_engine.py (generate, the sglang
# branch) and inference_engines/utils.py (get_sglang_sampling_params), at NovaSky-AI/SkyRL 4141495.


def skyrl_sampling_params(max_generate_length: int, temperature: float = 1.0) -> dict:
    return {
        "skip_special_tokens": True,
        "no_stop_trim": True,
        "max_new_tokens": max_generate_length,
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "stop": None,  # a configured key passed through as it is
    }


async def skyrl_generate(base_url: str, prompt_token_ids: list[list[int]], sampling_params: dict):
    """One batched /generate: a list of prompts in, a list of replies out, read in order."""
    payload = {"input_ids": prompt_token_ids, "sampling_params": sampling_params}
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with session.post(f"{base_url}/generate", json=payload, headers=headers) as response:
            response.raise_for_status()
            replies = await response.json()
    return [output["output_ids"] for output in replies], [o["meta_info"]["finish_reason"]["type"] for o in replies]
