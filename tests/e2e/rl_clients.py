"""AReaL's, verl's and SkyRL's SGLang clients, reproduced: the requests they send to an SGLang
server during rollouts and the way they read the replies, written from their source (files named
at each client; docs/journal/2026-11-26-rl-clients.md has the notes). Our code, not theirs: same
bodies, headers, routes and reads, without their frameworks around them. slime's is in
slime_client.py."""

from dataclasses import dataclass

import aiohttp

# AReaL: areal/engine/sglang_remote.py (SGLangBackend), areal/infra/remote_inf_engine.py (agenerate,
# check_health; its pause_generation and continue_generation come with weight updates), areal/infra/utils/http.py (arequest_with_retry).


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
        self.session, self.base_url = session, base_url

    async def agenerate(self, input_ids: list[int], max_new_tokens: int, ignore_eos: bool = False) -> ArealResult:
        """The interruption loop: resubmit prompt + output so far with the budget left until a
        stop or length ends it; a last abort reads as length."""
        input_ids, budget = list(input_ids), max_new_tokens
        tokens, logprobs, attempts, stop_reason = [], [], [], None
        while stop_reason not in ("stop", "tool_calls", "length") and len(tokens) < max_new_tokens:
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
