"""Scores, for both doors: how likely the served model finds each output after one input, the sum
over the output's tokens of log p(token | the input and the output's tokens before it).

Each output is a prompt run (prompt_runs.py) of input + output that scores its prompt from the
output's first position: the prompt logprobs `/generate` returns with `logprob_start_len` set to
the input's length, summed. They are raw (the model's own distribution), in float32, and read the
prefix cache as such a request does: at most the input's tokens but the last.
"""

import asyncio

import msgspec

from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.prompt_runs import PROMPT_ALONE, PromptRun, Refused, named, run_prompts
from schemas.embed import ScoreRequest, ScoreResult
from schemas.errors import Error
from schemas.generate import GenerateRequest
from schemas.requests import Tenant


async def score(
    pipeline: RequestPipeline, request: ScoreRequest, tenant: Tenant, fields: tuple[str, str]
) -> ScoreResult | Error:
    """Scores every output of `request`; `fields` are the door's names of the input and the
    outputs, for errors."""
    input_field, output_field = fields
    if (request.input_ids is None) == (request.text is None):
        return Error("invalid_request", "give exactly one of input_ids and text", param=input_field)
    if (request.output_ids is None) == (request.output_texts is None):
        return Error("invalid_request", "give exactly one of output_ids and output_texts", param=output_field)
    encoded = await _tokens(pipeline, request)
    if isinstance(encoded, Error):
        return encoded
    input_ids, outputs = encoded[0], encoded[1:]
    if not input_ids:  # its first token would have no logprob
        return Error("invalid_request", "the input encodes to no tokens", param=input_field)
    if (empty := next((i for i, output in enumerate(outputs) if not output), None)) is not None:
        return Error("invalid_request", "the output encodes to no tokens", param=f"{output_field}[{empty}]")
    params = msgspec.structs.replace(PROMPT_ALONE, prompt_logprobs_from=len(input_ids))
    runs = [
        PromptRun(GenerateRequest(input_ids=input_ids + output, params=params, cache_salt=request.cache_salt))
        for output in outputs
    ]
    records = await run_prompts(pipeline, runs, tenant)
    if isinstance(records, Refused):
        return named(records, output_field, len(runs))
    logprobs = [record.prompt_logprobs.whole().logprobs for record in records]
    return ScoreResult([sum(each) for each in logprobs], logprobs, outputs, len(input_ids))


async def _tokens(pipeline: RequestPipeline, request: ScoreRequest) -> list[list[int]] | Error:
    """The input's tokens, then each output's: as given, or encoded (an output as a continuation of
    the input, with no special tokens of its own)."""

    async def tokens(ids: list[int] | None, text: str | None, continuation: bool) -> list[int] | Error:
        if ids is not None:
            return list(ids)
        encoded = await pipeline.encode(GenerateRequest(text=text), continuation)
        return encoded if isinstance(encoded, Error) else encoded.token_ids

    output_ids = request.output_ids or [None] * len(request.output_texts)
    output_texts = request.output_texts or [None] * len(request.output_ids)
    pieces = await asyncio.gather(
        tokens(request.input_ids, request.text, False),
        *(tokens(ids, text, True) for ids, text in zip(output_ids, output_texts)),
    )
    return next((piece for piece in pieces if isinstance(piece, Error)), pieces)
