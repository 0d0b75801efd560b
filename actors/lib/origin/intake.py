"""What the origin checks and writes down when it takes a new request. No I/O.

Each field's range was checked when the request was decoded (schemas/generate.py); the rules here
span several fields. A request of n choices becomes n records, each a request of its own downstream.
"""

import random

import msgspec

from actors.lib.origin.request_stream import RequestRecord
from kernel.randomness import SEED_BITS, choice_seed
from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams
from schemas.requests import Tenant


def refusal(request: GenerateRequest) -> Error | None:
    """Why the origin cannot take `request`, naming the field at fault; None when it can."""
    prompts = [p for p in (request.text, request.input_ids, request.messages) if p is not None]
    if len(prompts) != 1:
        return Error("invalid_request", "give exactly one of text, input_ids and messages", param="prompt")
    if request.params.stop and not request.params.detokenize:
        return Error("invalid_request", "stop strings match text: they need detokenize", param="stop")
    if request.session is not None and request.n > 1:
        return Error("invalid_request", "a turn of a session has one choice: n must be 1", param="n")
    return None


def choice_records(
    request_id: str, prompt_ids: list[int], params: SamplingParams, n: int, tenant: Tenant
) -> list[RequestRecord]:
    """The records of the n choices of one prompt. Without a seed the request gets one of ours, so
    its draw is the same after a restart; choice i draws with `choice_seed(seed, i)`. The first
    choice computes the prompt and the others fork it. With n = 1 the choice is the request itself."""
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
        )
        for index, choice_id in enumerate(ids)
    ]
