"""Bad input gets an OpenAI-style error with the right status, and the server keeps serving."""

import httpx
import pytest

LONG_TEXT = "word " * 5000  # far past the demo model's context window


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", timeout=60, **kwargs)


def chat(**fields) -> dict:
    return {"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", b"{not json", 400),
        ("/v1/chat/completions", b"[1, 2]", 400),
        ("/v1/chat/completions", chat(max_tokens="many"), 400),
        ("/v1/chat/completions", chat(temperature={"a": 1}), 400),
        ("/v1/chat/completions", chat(max_tokens=0), 400),
        ("/v1/chat/completions", chat(max_tokens=-5), 400),
        ("/v1/chat/completions", chat(max_tokens=10_000_000), 400),
        ("/v1/chat/completions", {"model": "demo", "messages": []}, 400),
        ("/v1/chat/completions", chat(model="no-such-model"), 404),
        ("/v1/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": LONG_TEXT}]}, 400),
        ("/v1/completions", {"model": "demo", "prompt": LONG_TEXT}, 400),
        ("/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 0}, 400),
        ("/v1/completions", {"model": "demo", "prompt": [10**9]}, 400),
        ("/generate", {"input_ids": []}, 400),
        ("/generate", {"text": 5}, 400),
    ],
)
def test_bad_request_gets_openai_error(server, path, body, status):
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = post(server, path, headers={"Content-Type": "application/json"}, **sent)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    assert error["type"] in ("invalid_request_error", "not_found_error")
    good = post(server, "/v1/completions", json={"model": "demo", "prompt": "still there?", "max_tokens": 3})
    assert good.status_code == 200, good.text


def test_prompt_beyond_context_names_the_limit(server):
    response = post(server, "/v1/completions", json={"model": "demo", "prompt": LONG_TEXT, "max_tokens": 1})
    assert response.status_code == 400
    assert "maximum context length" in response.json()["error"]["message"]


def test_unknown_route_is_a_json_404(server):
    response = httpx.get(f"{server.base_url}/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["message"]


def test_sdk_raises_on_unknown_model(client):
    import openai

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="demo", prompt="x", max_tokens=0)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", chat(bad_words=["x"]), "bad_words"),  # vLLM's, not implemented
        ("/v1/chat/completions", chat(store=True), "store"),  # nothing is stored
        ("/v1/completions", {"model": "demo", "prompt": "x", "suffix": "y"}, "suffix"),
        ("/generate", {"text": "x", "sampling_params": {"min_tokens": 1}}, "sampling_params.min_tokens"),
        ("/generate", {"text": "x", "lora_path": "/a"}, "lora_path"),
        ("/v1/embeddings", {"input": "x", "truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
        ("/v1/responses", {"model": "demo", "input": "x", "previous_response_id": "r"}, "previous_response_id"),
        ("/pause_generation", {"mode": "abort", "timeout_s": 1}, "timeout_s"),
    ],
)
def test_a_field_not_honoured_is_refused_by_name(server, path, body, param):
    """The rule of every body: honoured, of no effect where it has no meaning, or refused naming it."""
    response = post(server, path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    good = post(server, "/v1/completions", json={"model": "demo", "prompt": "still there?", "max_tokens": 3})
    assert good.status_code == 200, good.text
