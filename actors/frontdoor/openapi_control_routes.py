"""/openapi.json's entries for the routes that inspect or steer the engine: SGLang's
/health_generate, info and load, sessions, /admin/*, pause and resume, live weights, and device
memory (sleep and wake). One entry per (method, path) that http_app.py adds;
tests/frontdoor/test_openapi.py holds the two equal.
"""

from typing import Any

from actors.frontdoor import weight_bodies as weights
from actors.frontdoor.memory_routes import SLEEP_LEVELS, TAGS
from actors.frontdoor.native_protocol import PUBLISH_BODY, FlushBody, SessionBody
from actors.frontdoor.openapi_route import Parameter, Route
from actors.frontdoor.pause_routes import VLLM_MODES, ContinueBody, PauseBody
from actors.frontdoor.sglang_info import LOAD_SECTIONS
from schemas.admin import CacheFlushed, CacheReport, SchedulerStats

ADMIN_ERRORS = (503, 504)  # the actor that answers is down or slow
WEIGHT_NAMED = "the name is a weight of the served checkpoint"
BOOLEAN = {"type": "string", "pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"}  # as .lower() reads it


def _admin_get(path: str, summary: str, ok_schema: Any = None) -> Route:
    return Route("get", path, summary, summary, errors=ADMIN_ERRORS, ok_schema=ok_schema)


def _weight_update(path: str, summary: str, body: Any, rule: str, body_required: bool = True) -> Route:
    # A failed update answers 400 with SGLang's fields beside the error; the old weights serve on.
    ok = "the update is applied: SGLang's fields"
    errors = (400, *ADMIN_ERRORS)
    return Route("post", path, summary, ok, body=body, body_required=body_required, errors=errors, rule=rule)


def _memory(path: str, summary: str, body: Any) -> list[Route]:
    return [
        Route(
            method,
            path,
            summary,
            "the memory's state after the call",
            body=body,
            body_required=False,
            errors=(400, *ADMIN_ERRORS),
        )
        for method in ("get", "post")
    ]


CONTROL_ROUTES: list[Route] = [
    Route("get", "/health_generate", "One token through every actor", "an empty body", media=(), errors=(503,)),
    *(
        Route("get", path, says, says, errors=ADMIN_ERRORS)
        for path, says in (
            ("/server_info", "The server's settings and load, as SGLang's"),
            ("/get_server_info", "The same as /server_info"),
            ("/model_info", "model_path, tokenizer_path, is_generation, as SGLang's"),
            ("/get_model_info", "The same as /model_info"),
            ("/get_load", "SGLang's older load shape"),
        )
    ),
    Route(
        "get",
        "/v1/loads",
        "Running and waiting requests and KV use, as SGLang's",
        "the load",
        errors=(400, *ADMIN_ERRORS),
        parameters=(
            Parameter(
                "include",
                {"type": "string", "x-beyond-schema": f"comma-separated, among {sorted(LOAD_SECTIONS)}"},
                "SGLang's sections; the core one is given whatever is asked",
            ),
        ),
    ),
    Route(
        "post",
        "/v1/sessions",
        "Open a session for multi-turn work",
        "the new session: its id, for `session_id`",
        body=SessionBody,
        body_required=False,
        errors=(400, 413, *ADMIN_ERRORS),
    ),
    Route(
        "delete",
        "/v1/sessions/{session_id}",
        "Close a session",
        "the session is closed and its pinned KV released",
        errors=(404, *ADMIN_ERRORS),
        parameters=(
            Parameter("session_id", {"type": "string"}, "the id POST /v1/sessions gave", required=True, where="path"),
            Parameter("user", {"type": "string"}, "the `user` the session was opened with"),
        ),
    ),
    _admin_get("/admin/stats", "Queue, running batch, KV blocks and prefix cache", SchedulerStats),
    _admin_get(
        "/admin/cache",
        "KV blocks free, cached, in use; public and private per tenant; hit rate; each tier's blocks, bytes and hits",
        CacheReport,
    ),
    Route(
        "post",
        "/admin/flush_cache",
        "Empty a tier of the KV cache (the GPU's without a body), or all of them",
        "the blocks freed, per tier",
        body=FlushBody,
        body_required=False,
        errors=(400, *ADMIN_ERRORS),
        ok_schema=CacheFlushed,
    ),
    Route(
        "post",
        "/admin/publish",
        "Make a prefix readable by every tenant",
        "the prefix is public",
        body=PUBLISH_BODY,
        errors=(400, 413, *ADMIN_ERRORS),
    ),
    Route(
        "post",
        "/pause_generation",
        "SGLang's pause",
        "the pause's state",
        body=PauseBody,
        body_required=False,
        errors=(400, *ADMIN_ERRORS),
    ),
    Route(
        "post",
        "/continue_generation",
        "SGLang's continue; 400 when generation is not paused",
        "the pause's state",
        body=ContinueBody,
        body_required=False,
        errors=(400, *ADMIN_ERRORS),
        rule="generation is paused",
    ),
    Route(
        "post",
        "/pause",
        "vLLM's pause",
        "the pause's state",
        errors=(400, *ADMIN_ERRORS),
        parameters=(
            Parameter(
                "mode",
                {"type": "string", "enum": sorted(VLLM_MODES)},
                "abort (default), wait for what runs, keep in place",
            ),
            Parameter("wait_for_inflight_requests", BOOLEAN, "vLLM's older form of mode=wait"),
            Parameter("clear_cache", BOOLEAN, "flush the prefix cache once paused (default true; not with keep)"),
        ),
    ),
    Route("post", "/resume", "vLLM's resume", "the pause's state", errors=ADMIN_ERRORS),
    Route("get", "/is_paused", "vLLM's pause state", '`{"is_paused"}`', errors=ADMIN_ERRORS),
    _weight_update(
        "/update_weights_from_disk",
        "Load a checkpoint directory into the live weights",
        weights.DiskBody,
        "the directory holds a checkpoint of the served architecture; one update runs at a time",
    ),
    _weight_update(
        "/update_weights_from_distributed",
        "Receive tensors broadcast over the trainer's group",
        weights.DistributedBody,
        "the group was joined (/init_weights_update_group) and the trainer broadcasts; one update at a time",
    ),
    _weight_update(
        "/update_weights_from_tensor",
        "Load tensors a colocated trainer shares by CUDA IPC",
        weights.TensorBody,
        "SGLang's serialized tensors of the served model, shared by CUDA IPC; one update runs at a time",
    ),
    _weight_update(
        "/init_weights_update_group",
        "Join the trainer's group",
        weights.InitGroupBody,
        "every rank of the trainer's group joins within --weight-group-join-timeout-s (five minutes by default), "
        "no step running meanwhile; the backend is one the server's device takes",
    ),
    _weight_update(
        "/destroy_weights_update_group",
        "Leave the trainer's group",
        weights.DestroyGroupBody,
        "no update runs over the group",
        body_required=False,
    ),
    _weight_update(
        "/update_weight_version",
        "Rename the serving weights' version",
        weights.VersionBody,
        "one update runs at a time",
    ),
    Route("get", "/get_weight_version", "The serving weights' version", '`{"weight_version"}`', errors=ADMIN_ERRORS),
    Route(
        "get",
        "/get_weights_by_name",
        "A weight's first values, from the query",
        "the values, rows of a matrix as lists",
        errors=(400, 404, *ADMIN_ERRORS),
        rule=WEIGHT_NAMED,
        parameters=(
            Parameter("name", {"type": "string", "minLength": 1}, "a checkpoint name", required=True),
            Parameter(
                "truncate_size", {"type": "string", "pattern": "^0*[1-9][0-9]*$"}, "values kept per row (default 100)"
            ),
        ),
    ),
    Route(
        "post",
        "/get_weights_by_name",
        "A weight's first values, from SGLang's body",
        "the values, rows of a matrix as lists",
        body=weights.WeightsByNameBody,
        errors=(400, 404, *ADMIN_ERRORS),
        rule=WEIGHT_NAMED,
    ),
    *_memory("/release_memory_occupation", "SGLang's sleep: give device memory back", weights.MemoryBody),
    *_memory("/resume_memory_occupation", "SGLang's wake", weights.MemoryBody),
    *(
        Route(
            method,
            "/flush_cache",
            "SGLang's flush; 400 while requests run, to retry",
            "the blocks freed",
            errors=(400, *ADMIN_ERRORS),
            rule="no request runs",
        )
        for method in ("get", "post")
    ),
    Route(
        "post",
        "/sleep",
        "vLLM's sleep",
        "the memory's state after the call",
        errors=(400, *ADMIN_ERRORS),
        parameters=(
            Parameter(
                "level",
                {"type": "string", "enum": list(SLEEP_LEVELS)},
                "1 or 2: a host copy of the weights is kept either way",
            ),
        ),
    ),
    Route(
        "post",
        "/wake_up",
        "vLLM's wake",
        "the memory's state after the call",
        errors=(400, *ADMIN_ERRORS),
        parameters=(
            Parameter(
                "tags",
                {"type": "array", "items": {"type": "string", "enum": list(TAGS)}},
                "the memory to take again; none: all",
            ),
        ),
    ),
    Route("get", "/is_sleeping", "vLLM's sleep state", '`{"is_sleeping"}`', errors=ADMIN_ERRORS),
    Route("post", "/reset_prefix_cache", "vLLM's flush, whatever runs", "the blocks freed", errors=ADMIN_ERRORS),
]
