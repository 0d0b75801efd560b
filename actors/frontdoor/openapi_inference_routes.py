"""/openapi.json's entries for the routes a client calls to run requests: health, metrics, this
document, the model list, and every route that runs a request on the engine (OpenAI's, Anthropic's,
embeddings and scores, SGLang's generate and abort). One entry per (method, path) that http_app.py
adds; tests/frontdoor/test_openapi.py holds the two equal.
"""

from actors.frontdoor.anthropic_messages import MessagesRequest
from actors.frontdoor.embedding_protocol import ENCODE_BODY, SCORE_BODY, EmbeddingsBody, SimilarityBody
from actors.frontdoor.openai_protocol import ChatCompletionRequest, CompletionRequest
from actors.frontdoor.openapi_route import JSON, Route
from actors.frontdoor.responses_api import ResponsesRequest
from actors.frontdoor.sglang_protocol import GENERATE_BODY, AbortBody

SSE = "text/event-stream"
# Statuses a request that runs on the engine may meet besides its own 400s: the model named is not
# served (404), a body over --max-body-bytes (413), too many in flight (429), an actor down or a
# request failing downstream (500, 503), no answer in time (504).
GENERATION_ERRORS = (400, 404, 413, 429, 500, 503, 504)


INFERENCE_ROUTES: list[Route] = [
    Route("get", "/health", "The process answers", '`{"status": "ok"}`'),
    Route("get", "/health/ready", "Every actor a request passes through can serve", "ready", errors=(503,)),
    Route(
        "get",
        "/metrics",
        "Prometheus metrics, vLLM's names where the meaning matches",
        "the metrics, in the text format or OpenMetrics as `Accept` asks",
        media=("text/plain", "application/openmetrics-text"),
    ),
    Route("get", "/openapi.json", "This document", "this document"),
    Route("get", "/v1/models", "The served model", "the model list"),
    Route(
        "post",
        "/v1/chat/completions",
        "OpenAI's chat completions, with vLLM's and SGLang's extras",
        "a chat completion, or with `stream` an SSE stream of chunks",
        media=(JSON, SSE),
        body=ChatCompletionRequest,
        errors=GENERATION_ERRORS,
    ),
    Route(
        "post",
        "/v1/completions",
        "OpenAI's completions, with vLLM's extras",
        "a completion, or with `stream` an SSE stream of chunks",
        media=(JSON, SSE),
        body=CompletionRequest,
        errors=GENERATION_ERRORS,
    ),
    Route(
        "post",
        "/v1/responses",
        "OpenAI's Responses API, stateless",
        "a response object, or with `stream` its typed events",
        media=(JSON, SSE),
        body=ResponsesRequest,
        errors=GENERATION_ERRORS,
    ),
    Route(
        "post",
        "/v1/messages",
        "Anthropic's Messages API",
        "a message, or with `stream` Anthropic's events",
        media=(JSON, SSE),
        body=MessagesRequest,
        errors=GENERATION_ERRORS,
        anthropic_errors=True,
    ),
    Route(
        "post",
        "/v1/embeddings",
        "OpenAI's embeddings",
        "unit-norm embeddings, as floats or base64",
        body=EmbeddingsBody,
        errors=GENERATION_ERRORS,
    ),
    Route(
        "post",
        "/encode",
        "SGLang's embeddings",
        "`{embedding, meta_info}` (a list for a batch)",
        body=ENCODE_BODY,
        errors=GENERATION_ERRORS,
    ),
    Route(
        "post",
        "/v1/score",
        "Log-likelihoods of outputs given an input",
        "each output's score",
        body=SCORE_BODY,
        errors=GENERATION_ERRORS,
    ),
    Route(
        "post",
        "/v1/similarity",
        "Cosine similarities of embeddings, as vLLM's /score for embedding models",
        "the similarity of each pair",
        body=SimilarityBody,
        errors=GENERATION_ERRORS,
    ),
    Route(
        "post",
        "/generate",
        "SGLang's native generate",
        "`{text, output_ids, meta_info}` (a list for a batch), or with `stream` an SSE stream",
        media=(JSON, SSE),
        body=GENERATE_BODY,
        errors=GENERATION_ERRORS,
    ),
    Route(
        "post",
        "/abort_request",
        "SGLang's abort: by rid prefix, or all",
        "the requests end with finish_reason abort and their output (an empty body)",
        media=(),
        body=AbortBody,
        body_required=False,
        errors=(400, 503),
    ),
]
