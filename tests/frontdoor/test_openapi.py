"""/openapi.json describes what the app serves: every route it adds, no other; bodies that refuse
unknown fields, as the decoders do; token ids bounded by the served vocabulary; the key a route
needs where keys are configured. (tests/e2e/test_openapi_fuzz.py holds the server to it.)"""

from actors.frontdoor.http_app import HttpApi
from actors.frontdoor.openapi import ModelFacts, openapi_document
from actors.frontdoor.sglang_info import ServerFacts
from actors.frontdoor.tenants import Tenants

FACTS = ModelFacts(vocab_size=2048, max_model_len=64)


def routes_served(tenants: Tenants = Tenants()) -> set[tuple[str, str]]:
    """The app's own route table: the HTTP app as the frontdoor builds it, nothing started."""
    api = HttpApi(None, None, None, tenants, ServerFacts("m", "m", 16, 8, 64, None), 1024, 8)
    # aiohttp answers HEAD on every GET route by itself.
    return {(r.method.lower(), r.resource.canonical) for r in api.build_app().router.routes() if r.method != "HEAD"}


def operations(document: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, item in document["paths"].items() for method in item}


def test_the_document_names_every_route_the_app_serves_and_no_other():
    assert operations(openapi_document("m", FACTS, Tenants().needs_key)) == routes_served()


def test_every_request_body_refuses_unknown_fields():
    """A Struct with properties is a body or a piece of one; the answers (errors, /admin/*) aside."""
    components = openapi_document("m", FACTS, Tenants().needs_key)["components"]["schemas"]
    open_objects = [
        name
        for name, schema in components.items()
        if "properties" in schema and schema.get("additionalProperties") is not False
    ]
    answers = ["AnthropicErrorBody", "CacheFlushed", "CacheReport", "ErrorBody", "SchedulerStats", "TierFigures"]
    assert sorted(open_objects) == answers


def test_token_ids_are_bounded_by_the_served_vocabulary():
    document = openapi_document("m", FACTS, Tenants().needs_key)
    chat = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    allowed = next(s for s in chat["allowed_token_ids"]["anyOf"] if s.get("type") == "array")
    assert allowed["items"]["maximum"] == FACTS.vocab_size - 1
    # Stop token ids are not checked (one outside the vocabulary is never drawn), so not bounded.
    stops = next(s for s in chat["stop_token_ids"]["anyOf"] if s.get("type") == "array")
    assert stops["items"]["maximum"] == 2**31 - 1
    unbounded = openapi_document("m", None, Tenants().needs_key)["components"]["schemas"]["ChatCompletionRequest"]
    assert next(s for s in unbounded["properties"]["allowed_token_ids"]["anyOf"] if s.get("type") == "array")["items"][
        "maximum"
    ] == (2**31 - 1)


def test_keys_show_as_security_and_401_where_a_route_needs_one():
    tenants = Tenants({"k1": "alice"}, admin_key="root")
    document = openapi_document("m", FACTS, tenants.needs_key)
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["security"] == [{"bearer": []}] and "401" in chat["responses"]
    health = document["paths"]["/health"]["get"]
    assert "security" not in health and "401" not in health["responses"]
    open_document = openapi_document("m", FACTS, Tenants().needs_key)
    assert "securitySchemes" not in open_document["components"]
    assert "401" not in open_document["paths"]["/v1/chat/completions"]["post"]["responses"]
