"""Structured output through the whole system: HTTP (OpenAI's `response_format`, vLLM's and SGLang's
fields) and the bus, on the demo model's random weights (whatever it draws, the output follows the
schema, regex or grammar) and, through the `openai` SDK's own `parse`, on the default chat model. A
schema, regex or grammar that does not parse is a 400 naming its field, and the server serves on.
"""

import asyncio
import json
import re
from typing import Literal

import httpx
import msgspec
import pytest
from pydantic import BaseModel, Field

from kernel.model_source import DEFAULT_MODEL
from schemas.errors import Error
from schemas.generate import Constraint, GenerateChunk, GenerateRequest, GenerateResult, SamplingParams


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)
    name: str = Field(max_length=12)


class Person(BaseModel):
    """Every string and list bounded, so a sentence always fits in the token budget."""

    name: str = Field(max_length=16)
    happy: bool
    pets: list[Pet] = Field(max_length=3)


PERSON = Person.model_json_schema()
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


async def post(client: httpx.AsyncClient, path: str, body: dict) -> httpx.Response:
    return await client.post(path, json=body, timeout=120)


async def test_json_schema_outputs_validate_beside_free_requests(server):
    """40 chat requests with a JSON schema and 8 without, all at once, so they share batches."""

    async def run() -> tuple[list[dict], list[dict]]:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            chats = [
                post(
                    client,
                    "/v1/chat/completions",
                    {
                        "messages": [{"role": "user", "content": f"person {i}"}],
                        "max_tokens": 400,
                        "temperature": 1.0,
                        "seed": i,
                        "response_format": JSON_SCHEMA_FORMAT,
                    },
                )
                for i in range(40)
            ]
            free = [
                post(client, "/v1/completions", {"prompt": f"story {i}", "max_tokens": 20, "ignore_eos": True})
                for i in range(8)
            ]
            replies = await asyncio.gather(*chats, *free)
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
        bodies = [r.json() for r in replies]
        return bodies[:40], bodies[40:]

    constrained, free = await run()
    for body in constrained:
        choice = body["choices"][0]
        Person.model_validate_json(choice["message"]["content"])
        assert choice["finish_reason"] == "stop"
    assert all(body["usage"]["completion_tokens"] == 20 for body in free)


async def test_a_streamed_json_schema_reply_parses_whole(server):
    body = {
        "messages": [{"role": "user", "content": "a person"}],
        "max_tokens": 400,
        "seed": 3,
        "stream": True,
        "response_format": JSON_SCHEMA_FORMAT,
    }
    text, finish = "", None
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body, timeout=120) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line.removeprefix("data: "))["choices"][0]
                    text += choice["delta"].get("content") or ""
                    finish = choice["finish_reason"] or finish
    Person.model_validate_json(text)
    assert finish == "stop"


@pytest.mark.parametrize(
    ("sampling", "matches"),
    [
        ({"regex": r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)"}, r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)"),
        ({"ebnf": 'root ::= item (", " item){0,3}\nitem ::= ("red" | "green" | "blue") " " [0-9]'}, None),
        ({"json_schema": json.dumps(PERSON)}, "person"),
    ],
)
async def test_generate_follows_sglangs_regex_ebnf_and_json_schema(server, sampling, matches):
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        replies = await asyncio.gather(
            *(
                post(client, "/generate", {"text": f"go {i}", "sampling_params": {**sampling, "max_new_tokens": 400}})
                for i in range(8)
            )
        )
    for reply in replies:
        assert reply.status_code == 200, reply.text
        text = reply.json()["text"]
        if matches == "person":
            Person.model_validate_json(text)
        else:
            assert re.fullmatch(matches or r"(red|green|blue) [0-9](, (red|green|blue) [0-9]){0,3}", text), text
        assert reply.json()["meta_info"]["finish_reason"]["type"] == "stop"


async def test_vllms_choice_and_completions_response_format(server):
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        choice = await post(client, "/v1/completions", {"prompt": "pick", "guided_choice": ["left", "right"]})
        obj = await post(
            client,
            "/v1/completions",
            {"prompt": "pick", "max_tokens": 30, "structured_outputs": {"regex": "(yes|no)!"}},
        )
    assert choice.json()["choices"][0]["text"] in ("left", "right")
    assert obj.json()["choices"][0]["text"] in ("yes!", "no!")


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
            "response_format.json_schema.schema",
            "Unsupported type",
        ),
        ("/v1/completions", {"guided_regex": "(ab"}, "guided_regex", "parenthesis"),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"grammar": "root ::= nothing"}},
            "structured_outputs.grammar",
            "",
        ),
        ("/generate", {"sampling_params": {"ebnf": "root ::= foo"}}, "sampling_params.ebnf", 'Rule "foo"'),
        ("/generate", {"sampling_params": {"regex": "[z-a]"}}, "sampling_params.regex", ""),
    ],
)
async def test_what_does_not_parse_is_a_400_naming_the_field_and_the_server_serves_on(server, path, body, param, words):
    prompt = {"text": "hi"} if path == "/generate" else {"prompt": "hi"}
    if path == "/v1/chat/completions":
        prompt = {"messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        refused = await post(client, path, {**prompt, **body})
        served = await post(client, "/v1/completions", {"prompt": "hi", "max_tokens": 4, "guided_regex": "[ab]{4}"})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert served.status_code == 200 and re.fullmatch("[ab]{4}", served.json()["choices"][0]["text"])


async def test_a_language_without_a_sentence_is_a_400_from_the_executor(server):
    """It parses, so the tokenizer lets it through; its first mask is empty, and the request (alone)
    ends with the client's error naming the field."""
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        refused = await post(client, "/v1/completions", {"prompt": "hi", "guided_regex": "[^\\x00-\\U0010FFFF]"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "guided_regex"
    assert "allows no token" in refused.json()["error"]["message"]


async def test_a_bus_client_gets_constrained_output_and_a_named_error(server):
    nc = await server.connect_nats()
    try:
        reply_type = GenerateChunk | GenerateResult | Error
        params = SamplingParams(max_tokens=400, constraint=Constraint("json_schema", json.dumps(PERSON)))
        request = msgspec.msgpack.encode(GenerateRequest(text="a person", params=params))
        result = msgspec.msgpack.decode((await nc.request("llm.generate", request, timeout=60)).data, type=reply_type)
        assert isinstance(result, GenerateResult) and result.finish_reason == "stop"
        Person.model_validate_json(result.text)
        bad = SamplingParams(constraint=Constraint("regex", "(ab"))
        request = msgspec.msgpack.encode(GenerateRequest(text="a person", params=bad))
        error = msgspec.msgpack.decode((await nc.request("llm.generate", request, timeout=60)).data, type=reply_type)
        assert isinstance(error, Error) and (error.code, error.param) == ("invalid_request", "params.constraint")
    finally:
        await nc.drain()


class City(BaseModel):
    name: str
    country: str
    population_millions: float


def test_the_sdks_parse_returns_a_valid_object_from_the_default_model(chat_client):
    completion = chat_client.chat.completions.parse(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Describe Paris as JSON with its name, country and population."}],
        response_format=City,
        max_tokens=120,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    assert choice.message.parsed.name
