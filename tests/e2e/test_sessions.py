"""Sessions through the whole stack, with the openai SDK: each turn continues the conversation and
computes only its new tokens, a branch can replace what came after its parent, and a closed,
expired, unknown or someone else's session is a 404."""

import time

import httpx
import msgspec
import openai
import pytest

from schemas.errors import Error
from schemas.generate import GenerateRequest, GenerateResult, SamplingParams, SessionTurn
from schemas.session import CloseSession, OpenSession, SessionClosed, SessionOpened

BLOCK = 16  # the server's KV block size: cached prefixes come in whole blocks
OPENED: list[tuple[str, dict]] = []  # each session a test opened over HTTP, with the query that closes it


@pytest.fixture(autouse=True)
def close_what_the_test_opened(server):
    """The server is shared with other files, and a session pins its blocks until closed: left open,
    it would hold them under the tests that check a server idle, whichever order they run in."""
    yield
    while OPENED:
        session_id, query = OPENED.pop()
        close_session(server, session_id, **query)  # a 404: closed by the test, or expired


def open_session(server, **body) -> str:
    response = httpx.post(f"{server.base_url}/v1/sessions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "session"
    OPENED.append((response.json()["id"], {"user": body["user"]} if "user" in body else {}))
    return response.json()["id"]


def close_session(server, session_id: str, **query) -> httpx.Response:
    return httpx.delete(f"{server.base_url}/v1/sessions/{session_id}", params=query, timeout=30)


def chat(client, session_id: str, content: str, **fields):
    return client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": content}],
        max_tokens=12,
        temperature=0,
        extra_body={"session_id": session_id, **fields},
    )


def generate(server, **body) -> dict:
    response = httpx.post(f"{server.base_url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def computed(reply) -> int:
    """The tokens of a finished turn whose KV was computed, in whole blocks: all but the last drawn."""
    return (reply.usage.prompt_tokens + reply.usage.completion_tokens - 1) // BLOCK * BLOCK


def cached(reply) -> int:
    return reply.usage.prompt_tokens_details.cached_tokens


def test_each_turn_computes_only_its_new_tokens(server, client):
    session = open_session(server)
    first = chat(client, session, "Tell me about the old lighthouse on the northern cliffs, and its keeper.")
    second = chat(client, session, "Who built it?")
    chunks = list(
        client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "And what became of them?"}],
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"session_id": session},
        )
    )
    third = chunks[-1]
    assert cached(first) == 0
    for before, after in ((first, second), (second, third)):
        assert after.usage.prompt_tokens > before.usage.prompt_tokens + before.usage.completion_tokens
        assert cached(after) == computed(before)  # everything the session had, in whole blocks


def test_a_turn_gives_what_its_whole_prompt_gives_alone(server, client):
    session = open_session(server)
    sampling = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    first_ids, second_ids = list(range(300, 340)), list(range(700, 711))
    first = generate(server, input_ids=first_ids, sampling_params=sampling, session_params={"id": session})
    second = generate(server, input_ids=second_ids, sampling_params=sampling, session_params={"id": session})
    whole_prompt = first_ids + first["output_ids"] + second_ids
    assert second["meta_info"]["prompt_tokens"] == len(whole_prompt)
    assert second["meta_info"]["cached_tokens"] == (len(first_ids) + 8 - 1) // BLOCK * BLOCK
    # Another tenant shares nothing with the session, so this computes the whole prompt.
    alone = client.completions.create(
        model="demo",
        prompt=whole_prompt,
        max_tokens=8,
        temperature=0,
        user="session-oracle",
        extra_body={"ignore_eos": True},
    )
    assert cached(alone) == 0
    assert second["text"] == alone.choices[0].text


def test_a_branch_from_an_earlier_turn_replaces_what_came_after_it(server, client):
    session = open_session(server)
    first = chat(client, session, "Describe a quiet harbour town at dawn, with its boats and gulls.")
    second = chat(client, session, "Now describe it at night.")
    branch = chat(client, session, "Now describe it in winter.", session_parent=first.id, session_replace=True)
    assert computed(first) <= cached(branch) < branch.usage.prompt_tokens
    after_branch = chat(client, session, "And in spring?")  # the latest turn is now the branch
    assert cached(after_branch) == computed(branch)
    with pytest.raises(openai.NotFoundError):
        chat(client, session, "Back to the night?", session_parent=second.id)  # replaced by the branch


def test_a_closed_or_unknown_session_is_not_found(server, client):
    session = open_session(server)
    chat(client, session, "Hello there.")
    response = close_session(server, session)
    assert response.status_code == 200 and response.json() == {"id": session, "object": "session", "deleted": True}
    for gone in (session, "no-such-session"):
        with pytest.raises(openai.NotFoundError) as error:
            chat(client, gone, "Are you still there?")
        assert error.value.body["code"] == "not_found" and error.value.body["param"] == "session_id"
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="demo", prompt="Hello", max_tokens=2, extra_body={"session_id": gone})
        body = {"text": "Hello", "session_params": {"id": gone}}
        response = httpx.post(f"{server.base_url}/generate", json=body, timeout=30)
        assert response.status_code == 404 and response.json()["error"]["param"] == "session_params.id"
        response = close_session(server, gone)
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


def test_a_session_belongs_to_the_user_that_opened_it(server, client):
    session = open_session(server, user="alice")
    with pytest.raises(openai.NotFoundError):
        chat(client, session, "Hello from Bob.", user="bob")
    assert chat(client, session, "Hello from Alice.", user="alice").choices[0].finish_reason in ("stop", "length")
    assert close_session(server, session).status_code == 404
    assert close_session(server, session, user="alice").status_code == 200


def test_an_idle_session_closes_itself(server, client):
    session = open_session(server, idle_timeout_s=1)
    chat(client, session, "Remember this.")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if close_session(server, session).status_code == 404:
            break
    else:
        pytest.fail("the idle session did not close itself")
    with pytest.raises(openai.NotFoundError):
        chat(client, session, "Do you remember?")


def test_open_refuses_bad_settings(server):
    for body in ({"capacity_tokens": -1}, {"idle_timeout_s": 0}, {"colour": "blue"}):
        response = httpx.post(f"{server.base_url}/v1/sessions", json=body, timeout=30)
        assert response.status_code == 400, body
    response = httpx.post(
        f"{server.base_url}/v1/sessions", json={"capacity_tokens": 64, "idle_timeout_s": 30}, timeout=30
    )
    OPENED.append((response.json()["id"], {}))
    assert response.json()["capacity_tokens"] == 64 and response.json()["idle_timeout_s"] == 30


async def test_a_bus_client_opens_a_session_and_takes_turns_in_it(server):
    nc = await server.connect_nats()

    async def ask(subject: str, message, reply_type):
        reply = await nc.request(subject, msgspec.msgpack.encode(message), timeout=60)
        return msgspec.msgpack.decode(reply.data, type=reply_type | Error)

    try:
        opened = await ask("llm.sessions", OpenSession(capacity_tokens=256), SessionOpened)
        session = SessionTurn(opened.session_id)
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        await ask(
            "llm.generate",
            GenerateRequest(input_ids=list(range(900, 930)), params=params, session=session),
            GenerateResult,
        )
        second = await ask(
            "llm.generate",
            GenerateRequest(input_ids=list(range(950, 960)), params=params, session=session),
            GenerateResult,
        )
        assert isinstance(second, GenerateResult), second
        assert second.prompt_tokens == 30 + 6 + 10
        assert second.cached_tokens == (30 + 6 - 1) // BLOCK * BLOCK
        assert await ask("llm.sessions", CloseSession(opened.session_id), SessionClosed) == SessionClosed(
            opened.session_id
        )
        gone = await ask("llm.generate", GenerateRequest(text="Hello", session=session), GenerateResult)
        assert isinstance(gone, Error) and gone.code == "not_found"
    finally:
        await nc.drain()
