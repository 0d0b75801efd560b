"""Serving the embedding and scoring routes: OpenAI's `/v1/embeddings` (floats or base64), SGLang's
`/encode`, `/v1/score` and `/v1/similarity`. Each parses its body into the bus's message
(embedding_protocol.py), runs it through the origin as the gateway does (actors/lib/origin/
embeddings.py, scoring.py) and answers one JSON body. A client that leaves cancels the handler,
which aborts whatever still runs.
"""

import base64
import time
import uuid

import numpy as np
from aiohttp import web

from actors.frontdoor import embedding_protocol as protocol
from actors.frontdoor.http_errors import error_response, overloaded
from actors.frontdoor.openai_responses import json_body
from actors.frontdoor.tenants import Tenants
from actors.lib.origin.embeddings import Embeddings, cosine, embed
from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.scoring import score
from schemas.embed import EmbedRequest, Pooling
from schemas.errors import Error


class EmbeddingServing:
    def __init__(
        self, pipeline: RequestPipeline, tenants: Tenants, model_name: str, max_concurrent: int, pooling: Pooling
    ) -> None:
        self.pipeline = pipeline
        self.tenants = tenants
        self.model_name = model_name
        self.max_concurrent = max_concurrent
        self.pooling = pooling  # the server's --embedding-pooling

    async def embeddings(self, request: web.Request) -> web.Response:
        parsed = protocol.parse_embeddings(await request.read(), self.model_name)
        if isinstance(parsed, Error):
            return error_response(parsed)
        done = await self._embed(request, parsed.request, parsed.user, "input")
        if not isinstance(done, Embeddings):
            return done
        data = [
            {"index": i, "object": "embedding", "embedding": _base64(v) if parsed.base64 else v.tolist()}
            for i, v in enumerate(done.vectors)
        ]
        return json_body(self._list("embd", data, sum(done.prompt_tokens)))

    async def encode(self, request: web.Request) -> web.Response:
        """SGLang's: `{"embedding", "meta_info"}` for one input, a list of those for several."""
        parsed = protocol.parse_encode(await request.read())
        if isinstance(parsed, Error):
            return error_response(parsed)
        embed_request, single = parsed
        field = "text" if embed_request.texts is not None else "input_ids"
        done = await self._embed(request, embed_request, "", field)
        if not isinstance(done, Embeddings):
            return done
        replies = [
            {"embedding": vector.tolist(), "meta_info": {"id": uuid.uuid4().hex, "prompt_tokens": tokens}}
            for vector, tokens in zip(done.vectors, done.prompt_tokens)
        ]
        return json_body(replies[0] if single else replies)

    async def similarity(self, request: web.Request) -> web.Response:
        parsed = protocol.parse_similarity(await request.read(), self.model_name)
        if isinstance(parsed, Error):
            return error_response(parsed)
        done = await self._embed(request, parsed.request, parsed.user, "text")
        if not isinstance(done, Embeddings):
            return done
        data = [
            {"index": i, "object": "score", "score": cosine(done.vectors[a], done.vectors[b])}
            for i, (a, b) in enumerate(parsed.pairs)
        ]
        return json_body(self._list("score", data, sum(done.prompt_tokens)))

    async def score(self, request: web.Request) -> web.Response:
        parsed = protocol.parse_score(await request.read(), self.model_name)
        if isinstance(parsed, Error):
            return error_response(parsed)
        outputs = len(parsed.request.output_ids or parsed.request.output_texts)
        if self.pipeline.in_flight + outputs > self.max_concurrent:
            return overloaded(self.max_concurrent)
        tenant = self.tenants.request_tenant(request["identity"], parsed.user)
        fields = (
            "input" if parsed.request.text is not None else "input_ids",
            "output" if parsed.request.output_texts is not None else "output_ids",
        )
        result = await score(self.pipeline, parsed.request, tenant, fields)
        if isinstance(result, Error):
            return error_response(result)
        data = [
            {"index": i, "object": "score", "score": total, "token_logprobs": logprobs, "output_ids": ids}
            for i, (total, logprobs, ids) in enumerate(zip(result.scores, result.token_logprobs, result.output_ids))
        ]
        tokens = sum(result.prompt_tokens + len(ids) for ids in result.output_ids)
        return json_body(self._list("score", data, tokens))

    async def _embed(
        self, request: web.Request, embed_request: EmbedRequest, user: str, field: str
    ) -> Embeddings | web.Response:
        inputs = len(embed_request.texts or embed_request.input_ids)
        if self.pipeline.in_flight + inputs > self.max_concurrent:
            return overloaded(self.max_concurrent)
        tenant = self.tenants.request_tenant(request["identity"], user)
        done = await embed(self.pipeline, embed_request, tenant, self.pooling, field)
        return error_response(done) if isinstance(done, Error) else done

    def _list(self, kind: str, data: list[dict], prompt_tokens: int) -> dict:
        return {
            "id": f"{kind}-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": self.model_name,
            "data": data,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }


def _base64(vector: np.ndarray) -> str:
    """OpenAI's `encoding_format: "base64"`: the float32 values, little-endian, base64-encoded."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
