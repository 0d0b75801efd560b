"""The OpenAPI document of the HTTP API, served at `/openapi.json`: every route http_app.py serves
(openapi_inference_routes.py and openapi_control_routes.py list them), each body described from
the very Struct that parses it, so the document refuses what the decoder refuses
(`additionalProperties: false`, ranges, lengths, and the rules a Struct cannot carry, given beside
it: `exactly_one`). A rule JSON Schema cannot state (it needs the model, a compiler, or another
field) is said in words on its field, as `x-beyond-schema`.

The served model's facts, which the executor reports, bound what depends on them: token ids by the
vocabulary. With API keys configured, the routes that need one say so, and their 401.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from actors.frontdoor.openapi_control_routes import CONTROL_ROUTES
from actors.frontdoor.openapi_inference_routes import INFERENCE_ROUTES
from actors.frontdoor.openapi_route import JSON, Route
from actors.frontdoor.request_fields import COMPONENT_REF
from actors.frontdoor.responses_api import ITEMS

# In the document's order: its paths are listed as they come here.
ROUTES = [*INFERENCE_ROUTES, *CONTROL_ROUTES]

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
ANTHROPIC_ERROR_BODY = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
ERROR_MEANINGS = {
    400: "the request is refused: `param` names the field at fault",
    401: "an API key is needed (the admin key on admin routes)",
    404: "the model, session or weight named does not exist",
    413: "the body is over the server's limit",
    429: "too many requests in flight: retry after `Retry-After`",
    500: "the request failed downstream",
    503: "an actor it needs is down: retry",
    504: "no answer in time",
}


@dataclass(frozen=True)
class ModelFacts:
    """What the executor reports of the served model."""

    vocab_size: int
    max_model_len: int


def openapi_document(model_name: str, facts: ModelFacts | None, needs_key: Callable[[str], bool]) -> dict:
    """`facts` None: the executor has not answered yet, and token ids are bounded by their type
    alone. `needs_key(path)`: whether the route answers 401 without a bearer key (tenants.py)."""
    bodies = [route.body for route in ROUTES if route.body is not None]
    answers = [route.ok_schema for route in ROUTES if route.ok_schema is not None]
    types = bodies + answers + list(ITEMS.values())
    schemas, components = msgspec.json.schema_components(types, ref_template=COMPONENT_REF)
    by_type = dict(zip([id(t) for t in types], schemas, strict=True))
    components |= {"ErrorBody": ERROR_BODY, "AnthropicErrorBody": ANTHROPIC_ERROR_BODY}
    paths: dict[str, dict] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method] = _operation(route, by_type, needs_key(route.path))
    limits = (
        ""
        if facts is None
        else f" Its vocabulary has {facts.vocab_size} tokens; its context window holds {facts.max_model_len}."
    )
    document = {
        "openapi": "3.1.0",
        "info": {
            "title": "kernel-llm",
            "version": "0.1.0",
            "description": f"Serving `{model_name}`.{limits} Every field of a body is honoured, or marked as accepted "
            "with no effect; any other field is refused with 400 naming it (docs/api.md). A method a path does not "
            "serve gets 405 with `Allow`.",
        },
        "paths": paths,
        "components": {"schemas": components, "responses": {"MethodNotAllowed": _method_not_allowed()}},
    }
    if any(needs_key(route.path) for route in ROUTES):
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return _bounded(document, facts)


def _operation(route: Route, by_type: dict[int, dict], keyed: bool) -> dict:
    operation: dict[str, Any] = {"summary": route.summary, "responses": _responses(route, by_type, keyed)}
    if route.parameters:
        operation["parameters"] = [
            {"name": q.name, "in": q.where, "required": q.required, "schema": q.schema, "description": q.description}
            | ({"style": "form", "explode": True} if q.schema.get("type") == "array" else {})
            for q in route.parameters
        ]
    if route.body is not None:
        schema = _ref_alone(by_type[id(route.body)])
        operation["requestBody"] = {"required": route.body_required, "content": {JSON: {"schema": schema}}}
    if keyed:
        operation["security"] = [{"bearer": []}]
    if route.rule:
        operation["x-beyond-schema"] = route.rule
    return operation


def _responses(route: Route, by_type: dict[int, dict], keyed: bool) -> dict:
    ok: dict[str, Any] = {"description": route.ok}
    if route.media:
        schema = by_type[id(route.ok_schema)] if route.ok_schema is not None else {}
        ok["content"] = {media: {"schema": schema} for media in route.media}
    error_schema = {"$ref": COMPONENT_REF.format(name="AnthropicErrorBody" if route.anthropic_errors else "ErrorBody")}
    codes = sorted({*route.errors, *((401,) if keyed else ())})
    responses = {"200": ok}
    for code in codes:
        responses[str(code)] = {"description": ERROR_MEANINGS[code], "content": {JSON: {"schema": error_schema}}}
    if 429 in codes:
        responses["429"]["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
    return responses


def _method_not_allowed() -> dict:
    return {
        "description": "the path does not serve this method",
        "headers": {"Allow": {"required": True, "schema": {"type": "string"}, "description": "the methods it serves"}},
        "content": {JSON: {"schema": {"$ref": COMPONENT_REF.format(name="ErrorBody")}}},
    }


def _ref_alone(schema: dict) -> dict:
    """A `$ref` with rules beside it (`exactly_one`) as an allOf of the two, which every JSON Schema
    reader takes the same way."""
    if "$ref" not in schema or len(schema) == 1:
        return schema
    rest = {key: value for key, value in schema.items() if key != "$ref"}
    return {"allOf": [{"$ref": schema["$ref"]}, rest]}


def _bounded(node: Any, facts: ModelFacts | None) -> Any:
    """Token ids (`x-token-id`) bounded by the served vocabulary."""
    if isinstance(node, list):
        return [_bounded(item, facts) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _bounded(value, facts) for key, value in node.items()}
    if facts is not None and node.get("x-token-id") and node.get("type") == "integer":
        node["maximum"] = facts.vocab_size - 1
    return node
