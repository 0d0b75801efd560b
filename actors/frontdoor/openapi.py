"""The OpenAPI document of the HTTP API, served at `/openapi.json`.

Request bodies are described from the same msgspec Structs that parse them, so the document
cannot drift from what the server accepts.
"""

import msgspec

from actors.frontdoor.embedding_protocol import EmbeddingsBody, EncodeBody, ScoreBody, SimilarityBody
from actors.frontdoor.native_protocol import PublishBody, SessionBody
from actors.frontdoor.openai_protocol import ChatCompletionRequest, CompletionRequest
from actors.frontdoor.sglang_protocol import AbortBody, GenerateBody
from schemas.admin import CacheReport, SchedulerStats

REF = "#/components/schemas/{name}"


def _json_body(schema_name: str, required: bool = True) -> dict:
    return {"required": required, "content": {"application/json": {"schema": {"$ref": REF.format(name=schema_name)}}}}


def _responses(ok: str, *errors: int) -> dict:
    error = {
        "description": "an OpenAI-style error",
        "content": {"application/json": {"schema": {"$ref": REF.format(name="ErrorBody")}}},
    }
    return {"200": {"description": ok}, **{str(code): error for code in errors}}


ERROR_BODY = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def openapi_document() -> dict:
    structs = [ChatCompletionRequest, CompletionRequest, GenerateBody, AbortBody, SessionBody, PublishBody]
    structs += [EmbeddingsBody, EncodeBody, ScoreBody, SimilarityBody]
    _, components = msgspec.json.schema_components(structs + [SchedulerStats, CacheReport], ref_template=REF)
    components["ErrorBody"] = ERROR_BODY
    post_errors = (400, 404, 413, 429, 503)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "kernel-llm",
            "version": "0.1.0",
            "description": "OpenAI-compatible completions, chat and embeddings (with vLLM's extras), scores and "
            "similarities, SGLang's native generate, encode, abort, health, info and load routes, sessions for "
            "multi-turn work, and admin.",
        },
        "paths": {
            "/v1/chat/completions": {
                "post": {
                    "requestBody": _json_body("ChatCompletionRequest"),
                    "responses": _responses("a chat completion, or an SSE stream of chunks", *post_errors),
                }
            },
            "/v1/completions": {
                "post": {
                    "requestBody": _json_body("CompletionRequest"),
                    "responses": _responses("a completion, or an SSE stream of chunks", *post_errors),
                }
            },
            "/v1/embeddings": {
                "post": {
                    "requestBody": _json_body("EmbeddingsBody"),
                    "responses": _responses("unit-norm embeddings, as floats or base64", *post_errors),
                }
            },
            "/encode": {
                "post": {
                    "requestBody": _json_body("EncodeBody"),
                    "responses": _responses("SGLang's {embedding, meta_info} (a list for a batch)", *post_errors),
                }
            },
            "/v1/score": {
                "post": {
                    "requestBody": _json_body("ScoreBody"),
                    "responses": _responses("each output's log-likelihood given the input", *post_errors),
                }
            },
            "/v1/similarity": {
                "post": {
                    "requestBody": _json_body("SimilarityBody"),
                    "responses": _responses("the cosine similarity of each pair's embeddings", *post_errors),
                }
            },
            "/generate": {
                "post": {
                    "requestBody": _json_body("GenerateBody"),
                    "responses": _responses(
                        "SGLang's {text, output_ids, meta_info} (a list for a batch), or an SSE stream", *post_errors
                    ),
                }
            },
            "/abort_request": {
                "post": {
                    "requestBody": _json_body("AbortBody", required=False),
                    "responses": _responses("the requests end with finish_reason abort and their output", 400),
                }
            },
            "/health_generate": {"get": {"responses": _responses("one token went through every actor", 503)}},
            **{
                path: {"get": {"responses": _responses(says, 503)}}
                for path, says in (
                    ("/server_info", "the server's settings and load, as SGLang's"),
                    ("/get_server_info", "the same as /server_info"),
                    ("/model_info", "model_path, tokenizer_path, is_generation, as SGLang's"),
                    ("/get_model_info", "the same as /model_info"),
                    ("/v1/loads", "running and waiting requests and KV use, as SGLang's (?include=core)"),
                    ("/get_load", "SGLang's older load shape"),
                )
            },
            "/v1/sessions": {
                "post": {
                    "requestBody": _json_body("SessionBody", required=False),
                    "responses": _responses("the new session: its id, for `session_id`", 400, 413, 503),
                }
            },
            "/v1/sessions/{session_id}": {
                "delete": {
                    "parameters": [
                        {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}},
                        {
                            "name": "user",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string"},
                            "description": "the `user` the session was opened with",
                        },
                    ],
                    "responses": _responses("the session is closed and its pinned KV released", 404, 503),
                }
            },
            "/v1/models": {"get": {"responses": _responses("the served model")}},
            "/health": {"get": {"responses": _responses("the process answers")}},
            "/health/ready": {
                "get": {
                    "responses": {
                        **_responses("every actor can serve now"),
                        "503": {"description": "an actor is down or stuck"},
                    }
                }
            },
            "/admin/stats": {"get": {"responses": _responses("queue, running batch, KV blocks and prefix cache", 503)}},
            "/admin/flush_cache": {"post": {"responses": _responses("cached blocks no request uses are freed", 503)}},
            "/admin/cache": {
                "get": {
                    "responses": _responses(
                        "KV blocks free, cached, in use; public and private per tenant; hit rate", 503
                    )
                }
            },
            "/admin/publish": {
                "post": {
                    "requestBody": _json_body("PublishBody"),
                    "responses": _responses("the prefix is readable by every tenant", 400, 413, 503),
                }
            },
            "/openapi.json": {"get": {"responses": _responses("this document")}},
        },
        "components": {"schemas": components},
    }
