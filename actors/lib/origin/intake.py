"""What the origin checks and writes down when it takes a new request. No I/O.

Each field's range was checked when the request was decoded (schemas/generate.py); the rules here
span several fields. A request of n choices becomes n records, each a request of its own downstream.
"""

import random
import re

import msgspec

from actors.lib.origin.request_stream import RequestRecord
from kernel.randomness import SEED_BITS, choice_seed
from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams
from schemas.requests import Tenant


def refusal(request: GenerateRequest) -> Error | None:
    """Why the origin cannot take `request`, naming the field at fault; None when it can."""
    params = request.params
    prompts = [p for p in (request.text, request.input_ids, request.messages) if p is not None]
    if len(prompts) != 1:
        return Error("invalid_request", "give exactly one of text, input_ids and messages", param="prompt")
    if request.chat_template is not None and request.messages is None:
        return Error("invalid_request", "tools and template variables go with messages", param="chat_template")
    if params.stop and not params.detokenize:
        return Error("invalid_request", "stop strings match text: they need detokenize", param="stop")
    if params.stop_regex and not params.detokenize:
        return Error("invalid_request", "stop regexes match text: they need detokenize", param="stop_regex")
    if error := _regex_refusal(params.stop_regex):
        return error
    if request.session is not None and request.n > 1:
        return Error("invalid_request", "a turn of a session has one choice: n must be 1", param="n")
    if params.max_tokens == 0 and request.n > 1:
        return Error("invalid_request", "with max_tokens 0 nothing is drawn: n must be 1", param="n")
    if params.max_tokens == 0 and request.session is not None:
        return Error(
            "invalid_request",
            "a turn of a session generates its reply: max_tokens must be at least 1",
            param="max_tokens",
        )
    if request.cache_salt and request.session is not None:
        return Error(
            "invalid_request",
            "a session's turns read the session's own cached prefix: no cache_salt",
            param="cache_salt",
        )
    return None


def _regex_refusal(patterns: list[str]) -> Error | None:
    for index, pattern in enumerate(patterns):
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            return Error(
                "invalid_request", f"stop_regex {pattern!r} is not a valid regex: {exc}", param=f"stop_regex[{index}]"
            )
        if regex.fullmatch(""):
            return Error(
                "invalid_request", f"stop_regex {pattern!r} matches the empty text", param=f"stop_regex[{index}]"
            )
    return None


def choice_records(
    request_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    n: int,
    tenant: Tenant,
    created: float,
    pooling: Pooling | None = None,
) -> list[RequestRecord]:
    """The records of the n choices of one prompt. Without a seed the request gets one of ours, so
    its draw is the same after a restart; choice i draws with `choice_seed(seed, i)`. The first
    choice computes the prompt and the others fork it. With n = 1 the choice is the request itself.
    Each record keeps the request's id as its client knows it, and `created`, when it was received."""
    if params.seed is None:
        params = msgspec.structs.replace(params, seed=random.getrandbits(SEED_BITS))
    ids = [request_id] if n == 1 else [f"{request_id}-{index}" for index in range(n)]
    return [
        RequestRecord(
            choice_id,
            prompt_ids,
            msgspec.structs.replace(params, seed=choice_seed(params.seed, index)),
            tenant,
            fork_of=ids[0] if index else None,
            client_request_id=request_id,
            created=created,
            pooling=pooling,
        )
        for index, choice_id in enumerate(ids)
    ]
