"""Requests that compute their prompt and draw nothing, through the origin like any other: an
embedding's (its pooled vector comes with its end) and a score's (its prompt's logprobs from a
position). Both doors (the frontdoor and the gateway) run them here.

Each prompt is a request of its own, taking its token ids from the step outputs (no tokenizer in
the way, no text). A batch is submitted at once and awaited to its last end; every request is
closed whatever happens, so a client that leaves aborts the rest, and a refusal aborts the others.
"""

import asyncio
from typing import NamedTuple

from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.request_stream import RequestGroup, RequestRecord
from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams
from schemas.requests import Tenant

# The prompt alone: no token drawn, and no text, so nothing waits on a tokenizer.
PROMPT_ALONE = SamplingParams(max_tokens=0, detokenize=False)


class PromptRun(NamedTuple):
    prompt: GenerateRequest  # its text or input_ids, and `PROMPT_ALONE`'s parameters (or more)
    pooling: Pooling | None = None  # an embedding


class Refused(NamedTuple):
    """Why the run of prompt `index` failed: the answer to the whole batch."""

    index: int
    error: Error


async def run_prompts(
    pipeline: RequestPipeline, runs: list[PromptRun], tenant: Tenant
) -> list[RequestRecord] | Refused:
    """Runs every prompt at once; their records once all have ended (each `embedding` or
    `prompt_logprobs` delivered), in order, or the first refusal or failure."""
    groups: list[RequestGroup | None] = [None] * len(runs)

    async def submit(index: int, run: PromptRun) -> Error | None:
        group = await pipeline.submit(run.prompt, tenant, pooling=run.pooling)
        if isinstance(group, Error):
            return group
        groups[index] = group  # at once: a cancelled batch closes what it submitted
        return None

    try:
        submitted = await asyncio.gather(*(submit(i, run) for i, run in enumerate(runs)))
        if refused := _first(submitted):
            return refused
        return _first(await asyncio.gather(*map(_end, groups))) or [g.choices[0].record for g in groups]
    finally:
        await asyncio.gather(*(group.close() for group in groups if group is not None))


async def _end(group: RequestGroup) -> Error | None:
    """Waits for the request's end; its failure, if it failed or was aborted (by an admin's abort
    or a pause that aborts) before its prompt was whole."""
    async for _, output in group:
        if output.error:
            return output.error
        if output.finish_reason == "abort":
            return Error("unavailable", "the request was aborted before its prompt was computed", retriable=True)
    return None


def _first(errors: list[Error | None]) -> Refused | None:
    return next((Refused(i, error) for i, error in enumerate(errors) if error is not None), None)


def named(refused: Refused, field: str, inputs: int) -> Error:
    """The error of a refused run as its door says it: the prompt named as the door's `field`
    (`field[i]` in a batch of several `inputs`), which the scheduler calls `prompt`."""
    error = refused.error
    if error.param != "prompt":
        return error
    param = field if inputs == 1 else f"{field}[{refused.index}]"
    message = error.message if inputs == 1 else f"{param}: {error.message}"
    return Error(error.code, message, param=param, retriable=error.retriable)
