"""Embeddings, for both doors: each input a prompt run (prompt_runs.py) that pools its final hidden
states as the server's `--embedding-pooling` says, then the vector truncated to the dimensions asked
and normalised to unit length here, as vLLM's embedding pooler and OpenAI's `dimensions` do.

Truncation is honoured for every model: the served causal LMs were not trained for it (matryoshka
models are), so the first dimensions of a vector keep less of its meaning than a shorter model's
would; vLLM refuses `dimensions` for such a model, this server gives what was asked.
"""

from dataclasses import dataclass

import numpy as np

from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.prompt_runs import PROMPT_ALONE, PromptRun, Refused, named, run_prompts
from schemas.embed import EmbedRequest, Pooling
from schemas.errors import Error
from schemas.generate import GenerateRequest
from schemas.requests import Tenant


@dataclass(frozen=True)
class Embeddings:
    vectors: list[np.ndarray]  # [hidden or dimensions] float32 of unit norm, one per input, in order
    prompt_tokens: list[int]  # each input's tokens


async def embed(
    pipeline: RequestPipeline, request: EmbedRequest, tenant: Tenant, pooling: Pooling, field: str
) -> Embeddings | Error:
    """Embeds every input of `request` (its fields checked when it was decoded); a refused input is
    named as the door's `field` (`field[i]` in a batch)."""
    texts, ids = request.texts, request.input_ids
    if (texts is None) == (ids is None):
        return Error("invalid_request", "give exactly one of texts and input_ids", param=field)
    salt = request.cache_salt
    prompts = (
        [GenerateRequest(text=text, params=PROMPT_ALONE, cache_salt=salt) for text in texts]
        if texts is not None
        else [GenerateRequest(input_ids=prompt, params=PROMPT_ALONE, cache_salt=salt) for prompt in ids]
    )
    runs = [PromptRun(prompt, pooling) for prompt in prompts]
    records = await run_prompts(pipeline, runs, tenant)
    if isinstance(records, Refused):
        return named(records, field, len(runs))
    hidden = len(records[0].embedding) // 4  # the model's width, known once a vector came (float32)
    if request.dimensions is not None and request.dimensions > hidden:
        message = f"dimensions is {request.dimensions}, more than the model's {hidden}"
        return Error("invalid_request", message, param="dimensions")
    return Embeddings(
        [unit_vector(record.embedding, request.dimensions) for record in records],
        [len(record.prompt_ids) for record in records],
    )


def unit_vector(pooled: bytes, dimensions: int | None = None) -> np.ndarray:
    """The pooled vector (float32 little-endian), its first `dimensions` kept (None: all), of unit
    L2 norm (a vector of zeros stays zeros)."""
    vector = np.frombuffer(pooled, "<f4")[:dimensions].astype(np.float64)
    norm = np.linalg.norm(vector)
    return (vector / norm if norm > 0 else vector).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine similarity of two unit vectors."""
    return float(np.dot(a.astype(np.float64), b.astype(np.float64)))
