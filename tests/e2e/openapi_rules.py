"""schemathesis' `positive_data_acceptance`, held to what /openapi.json says in words.

A body can be valid under JSON Schema and still be refused: a rule that needs the model (a
vocabulary, a chat template, a context window), a compiler (a regex, a grammar) or another field's
value (a tool result answering an earlier call) cannot be written as a schema. The document states
such a rule on its field, as `x-beyond-schema`, and the context window in its description; the
server's 400 names the field (`param`), or says `context_length_exceeded`. So the built-in check
runs in full, and the one answer let through is a 400 that names a field whose rule the document
states, or the context window: a 400 for anything else (a length, a type, a required field the
document missed) still fails. Loaded by `st run` through SCHEMATHESIS_HOOKS.

`/init_weights_update_group` joins the trainer's group at the body's `master_address`: every call
names instead an address of TEST-NET-1 (RFC 5737), which no network routes, so a fuzzed body makes
the server reach nobody (it times out instead). Only a non-empty string is replaced, the one kind the
document allows, so a body stays valid or invalid as it was generated.
"""

import re

import schemathesis
from schemathesis.checks import positive_data_acceptance
from schemathesis.core.failures import Failure

MARK = "x-beyond-schema"
UNROUTED_ADDRESS = "192.0.2.1"


@schemathesis.hook("before_call").apply_to(path="/init_weights_update_group")
def join_no_one(ctx, case, **kwargs):
    if isinstance(case.body, dict) and isinstance(case.body.get("master_address"), str) and case.body["master_address"]:
        case.body["master_address"] = UNROUTED_ADDRESS


@schemathesis.check
def valid_data_refused_only_by_a_stated_rule(ctx, response, case):
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if response.status_code == 400 and _stated(case, response):
            return None
        raise


def _stated(case, response) -> bool:
    body = response.json()
    error = body.get("error") or {}
    if error.get("code") == "context_length_exceeded":
        return True
    document = case.operation.schema.raw_schema
    operation = document["paths"][case.operation.path][case.method.lower()]
    components = document["components"]["schemas"]
    anthropic = body.get("type") == "error"
    param = _anthropic_param(error.get("message", "")) if anthropic else error.get("param")
    if not param:  # no field at fault: a rule of the server's state, which the operation states
        return bool(operation.get(MARK))
    for parameter in operation.get("parameters", []):
        if parameter["name"] == param and parameter["schema"].get(MARK):
            return True
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    names = [name for name in re.split(r"\.|(\[\d+\])", param) if name]
    return body is not None and _marked(body, ["[]" if name.startswith("[") else name for name in names], components)


def _anthropic_param(message: str) -> str | None:
    """Anthropic's errors have no `param`: the field heads the message (`max_tokens: ...`, or
    `max_tokens needs ...`), or is the first in backticks (`Invalid value for `max_tokens`: ...`)."""
    if head := re.match(r"([\w.\[\]]+): ", message):
        return head.group(1)
    if quoted := re.search(r"`([^`]+)`", message):
        return quoted.group(1)
    head = re.match(r"[\w.\[\]]+", message)
    return head.group(0) if head else None


def _marked(schema: dict, names: list[str], components: dict) -> bool:
    """Whether the field at `names` (properties, `[]` for an item) or one that holds it carries the mark."""
    while "$ref" in schema and len(schema) == 1:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    if schema.get(MARK):
        return True
    rest = {key: value for key, value in schema.items() if key != "$ref"}
    branches = [*rest.get("allOf", []), *rest.get("anyOf", []), *rest.get("oneOf", [])]
    if "$ref" in schema:
        branches.append({"$ref": schema["$ref"]})
    if any(_marked(branch, names, components) for branch in branches):
        return True
    if not names:
        return False
    head, tail = names[0], names[1:]
    if head == "[]":
        items = schema.get("items")
        return isinstance(items, dict) and _marked(items, tail, components)
    prop = schema.get("properties", {}).get(head)
    return prop is not None and _marked(prop, tail, components)
