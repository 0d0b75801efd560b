"""API keys and tenants, through HTTP with the openai SDK and on the bus with each tenant's NATS
credentials: the tenant comes from the key (over HTTP) or from the subject only its user may
publish on (the bus), cached prefixes and replies never cross tenants, a client cannot borrow
another tenant's name nor pass for several tenants, and only the admin key or the admin
credentials reach the admin API."""

import asyncio
import json
import stat

import httpx
import msgspec
import nats.errors
import openai
import pytest

from kernel import bus_auth, bus_grants
from ops.bus_client import stream_generate
from ops.local_server import start_server
from schemas.admin import GetStats, SchedulerStats
from schemas.errors import Error
from schemas.generate import AbortGenerate, GenerateChunk, GenerateRequest, GenerateResult, SamplingParams, SessionTurn
from schemas.requests import Aborted
from schemas.session import CloseSession, OpenSession, SessionClosed, SessionOpened
from tests.e2e.nats_probe import Connection

PROMPT = "Our company handbook, chapter one: the principles we hold and the way we work together. " * 5
KEYS = {"key-alpha": "alpha", "key-beta": "beta"}
CROWD = ("gamma", "delta", "epsilon")  # the tenants of the publication test
ADMIN_KEY = "admin-secret"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    """Five tenants, and a prefix public once three sent it (`--public-prefix-tenants 3`): the
    tests of privacy send each prefix as two tenants at most, the publication test as three."""
    data_dir = tmp_path_factory.mktemp("tenants")
    keys_file = data_dir / "keys.json"
    keys_file.write_text(json.dumps(KEYS | {f"key-{tenant}": tenant for tenant in CROWD}))
    running = start_server(
        data_dir,
        "--num-kv-blocks",
        "256",
        "--api-keys",
        str(keys_file),
        "--admin-key",
        ADMIN_KEY,
        "--public-prefix-tenants",
        "3",
    )
    yield running
    running.stop()


def client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def cached(server, key: str, user: str | None = None, prompt: str = PROMPT) -> int:
    extra = {"user": user} if user else {}
    reply = client(server, key).completions.create(model="demo", prompt=prompt, max_tokens=2, temperature=0, **extra)
    return reply.usage.prompt_tokens_details.cached_tokens


def test_keys_are_required_and_checked(keyed_server):
    with pytest.raises(openai.AuthenticationError):
        client(keyed_server, "wrong-key").models.list()
    assert httpx.post(f"{keyed_server.base_url}/v1/completions", json={"prompt": "x"}).status_code == 401
    assert httpx.get(f"{keyed_server.base_url}/health").status_code == 200
    assert [m.id for m in client(keyed_server, "key-alpha").models.list().data] == ["demo"]


def test_a_tenant_prefix_stays_private_even_to_a_client_naming_that_tenant(keyed_server):
    assert cached(keyed_server, "key-alpha") == 0
    assert cached(keyed_server, "key-alpha") > 0
    assert cached(keyed_server, "key-beta") == 0
    assert cached(keyed_server, "key-beta", user="alpha") == 0  # `user` narrows within beta only


def test_admin_routes_need_the_admin_key(keyed_server):
    url = f"{keyed_server.base_url}/admin/stats"
    assert httpx.get(url, headers={"Authorization": "Bearer key-alpha"}).status_code == 401
    response = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 200 and response.json()["total_blocks"] == 256


BUS_PROMPT = "Beta's quarterly figures, which alpha must never learn of, nor their mere existence. " * 5


def tenant_credentials(server, tenant: str) -> bus_auth.BusCredentials:
    return bus_auth.load_credentials(bus_auth.credentials_path(server.data_dir, bus_grants.tenant_user(tenant)))


async def ask(nc, subject: str, message, reply_type, timeout_s: float = 60):
    reply = await nc.request(subject, msgspec.msgpack.encode(message), timeout=timeout_s)
    return msgspec.msgpack.decode(reply.data, type=reply_type | Error)


async def bus_cached(server, tenant: str, user: str = "", prompt: str = BUS_PROMPT) -> int:
    """Sends `prompt` as `tenant`, with its own credentials on its own subject, as `user`."""
    nc = await server.connect_nats(bus_grants.tenant_user(tenant))
    try:
        request = GenerateRequest(text=prompt, params=SamplingParams(max_tokens=2, temperature=0), user=user)
        result = await ask(nc, f"llm.generate.{tenant}", request, GenerateResult)
        assert isinstance(result, GenerateResult), result
        return result.cached_tokens
    finally:
        await nc.drain()


def test_each_tenant_and_the_admin_get_a_credential_file_and_the_client_none(keyed_server):
    bus_dir = keyed_server.data_dir / "bus"
    tenants = [*KEYS.values(), *CROWD]
    assert sorted(p.name for p in (bus_dir / "tenants").iterdir()) == sorted(f"{tenant}.json" for tenant in tenants)
    assert (bus_dir / "admin.json").exists() and not (bus_dir / "client.json").exists()
    assert stat.S_IMODE((bus_dir / "tenants").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (bus_dir / "tenants").iterdir())
    assert tenant_credentials(keyed_server, "alpha").inbox_prefix == "llm.inbox.tenant.alpha"


async def test_on_the_bus_the_tenant_comes_from_the_subject_and_user_only_narrows(keyed_server):
    assert await bus_cached(keyed_server, "beta") == 0
    assert await bus_cached(keyed_server, "beta") > 0
    assert await bus_cached(keyed_server, "alpha", user="beta") == 0  # nothing of beta's private prefix
    assert cached(keyed_server, "key-beta", prompt=BUS_PROMPT) > 0  # the same tenant as beta's HTTP key


async def test_a_tenant_publishes_only_on_its_own_subjects_and_reads_only_its_own_replies(keyed_server):
    alpha = await Connection.open(keyed_server.nats_url, tenant_credentials(keyed_server, "alpha"))
    spy = await alpha.nc.subscribe("llm.inbox.tenant.beta.>")
    await alpha.nc.subscribe("_INBOX.>")
    for subject in ("llm.generate.beta", "llm.sessions.beta", "llm.generate", "llm.sessions"):
        await alpha.nc.publish(subject, b"\x80")
    await alpha.settle()
    assert 'nats: permissions violation for subscription to "llm.inbox.tenant.beta.>"' in alpha.errors
    assert 'nats: permissions violation for subscription to "_inbox.>"' in alpha.errors  # nats-py lowercases errors
    for subject in ("llm.generate.beta", "llm.sessions.beta", "llm.generate", "llm.sessions"):
        assert f'nats: permissions violation for publish to "{subject}"' in alpha.errors
    beta = await keyed_server.connect_nats(bus_grants.tenant_user("beta"))
    request = GenerateRequest(text="Hello", params=SamplingParams(max_tokens=4, ignore_eos=True), stream=True)
    replies = [reply async for reply in stream_generate(beta, request, subject="llm.generate.beta")]
    assert isinstance(replies[0], GenerateChunk) and replies[-1].completion_tokens == 4
    await beta.drain()
    with pytest.raises(nats.errors.TimeoutError):
        await spy.next_msg(timeout=0.5)
    await alpha.close()


async def test_a_tenant_cannot_resume_another_tenants_stream(keyed_server):
    beta = await keyed_server.connect_nats(bus_grants.tenant_user("beta"))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first = GenerateRequest(text="Hello", params=params, request_id="beta-run")
    done = await ask(beta, "llm.generate.beta", first, GenerateResult)
    assert isinstance(done, GenerateResult)
    await beta.drain()
    alpha = await keyed_server.connect_nats(bus_grants.tenant_user("alpha"))
    replay = GenerateRequest(text="Hello", request_id="beta-run", resume_from=0)
    refused = await ask(alpha, "llm.generate.alpha", replay, GenerateResult)
    assert isinstance(refused, Error) and refused.param == "request_id"
    await alpha.drain()


async def test_a_tenant_aborts_its_own_requests_alone(keyed_server):
    """By id or all at once, on its own subject: another tenant's request runs on to its end."""
    alpha = await keyed_server.connect_nats(bus_grants.tenant_user("alpha"))
    beta = await keyed_server.connect_nats(bus_grants.tenant_user("beta"))
    long = SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)
    short = msgspec.structs.replace(long, max_tokens=100)
    runs = {
        name: asyncio.create_task(
            ask(
                nc, f"llm.generate.{tenant}", GenerateRequest(text="Hi", params=params, request_id=name), GenerateResult
            )
        )
        for name, nc, tenant, params in [
            ("alpha-1", alpha, "alpha", long),
            ("alpha-2", alpha, "alpha", long),
            ("beta-1", beta, "beta", short),
        ]
    }
    await asyncio.sleep(0.5)
    assert await ask(beta, "llm.generate.beta", AbortGenerate(request_id="alpha-1"), Aborted) == Aborted([])
    assert await ask(alpha, "llm.generate.alpha", AbortGenerate(request_id="alpha-1"), Aborted) == Aborted(["alpha-1"])
    assert sorted((await ask(alpha, "llm.generate.alpha", AbortGenerate(abort_all=True), Aborted)).request_ids) == [
        "alpha-2"
    ]
    results = {name: await run for name, run in runs.items()}
    assert [results[name].finish_reason for name in ("alpha-1", "alpha-2", "beta-1")] == ["abort", "abort", "length"]
    assert results["beta-1"].completion_tokens == 100
    await alpha.drain()
    await beta.drain()


async def test_a_session_opened_on_the_bus_belongs_to_the_subjects_tenant(keyed_server):
    alpha = await keyed_server.connect_nats(bus_grants.tenant_user("alpha"))
    beta = await keyed_server.connect_nats(bus_grants.tenant_user("beta"))
    opened = await ask(alpha, "llm.sessions.alpha", OpenSession(capacity_tokens=256), SessionOpened)
    assert isinstance(opened, SessionOpened), opened
    turn = GenerateRequest(text="Hello", params=SamplingParams(max_tokens=2), session=SessionTurn(opened.session_id))
    as_alpha = await ask(beta, "llm.generate.beta", msgspec.structs.replace(turn, user="alpha"), GenerateResult)
    assert isinstance(as_alpha, Error) and as_alpha.code == "not_found"  # beta/alpha is not alpha
    with pytest.raises(openai.NotFoundError):
        client(keyed_server, "key-beta").completions.create(
            model="demo", prompt="Hello", max_tokens=2, extra_body={"session_id": opened.session_id}
        )
    assert isinstance(await ask(alpha, "llm.generate.alpha", turn, GenerateResult), GenerateResult)
    reply = client(keyed_server, "key-alpha").completions.create(
        model="demo", prompt="Hello", max_tokens=2, extra_body={"session_id": opened.session_id}
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    refused = await ask(beta, "llm.sessions.beta", CloseSession(opened.session_id, user="alpha"), SessionClosed)
    assert isinstance(refused, Error) and refused.code == "not_found"
    closed = await ask(alpha, "llm.sessions.alpha", CloseSession(opened.session_id), SessionClosed)
    assert closed == SessionClosed(opened.session_id)
    await alpha.drain()
    await beta.drain()


async def test_tenants_cannot_call_the_admin_subjects_and_the_admin_credentials_can(keyed_server):
    alpha = await Connection.open(keyed_server.nats_url, tenant_credentials(keyed_server, "alpha"))
    with pytest.raises(nats.errors.TimeoutError):  # the server drops the request: no scheduler sees it
        await alpha.nc.request("llm.admin.stats", msgspec.msgpack.encode(GetStats()), timeout=1)
    await alpha.settle()
    assert 'nats: permissions violation for publish to "llm.admin.stats"' in alpha.errors
    await alpha.close()
    admin = await keyed_server.connect_nats(bus_grants.ADMIN)
    stats = await ask(admin, "llm.admin.stats", GetStats(), SchedulerStats, timeout_s=10)
    assert isinstance(stats, SchedulerStats) and stats.total_blocks == 256
    await admin.drain()


async def test_one_key_under_many_users_is_one_tenant_toward_publication(keyed_server):
    """A key holder that sends a guessed prefix as K different users, over HTTP and the bus, passes
    for one tenant, not K: it gets no hit until K - 1 other tenants sent the prefix too, as the
    README promises. K keys do make the prefix public."""
    guess = "The board's confidential memo on the merger, first paragraph, as every draft begins. " * 5
    as_users = [cached(keyed_server, "key-gamma", user=f"u{i}", prompt=guess) for i in range(3)]
    as_users.append(await bus_cached(keyed_server, "gamma", user="u3", prompt=guess))
    assert as_users == [0, 0, 0, 0]  # four users of gamma, each reading only its own
    assert cached(keyed_server, "key-delta", prompt=guess) == 0  # the second tenant: still private
    assert await bus_cached(keyed_server, "epsilon", prompt=guess) > 0  # the third tenant reads it at once
    assert cached(keyed_server, "key-gamma", user="u9", prompt=guess) > 0  # public: for every user of every key


def test_pausing_needs_the_admin_key(keyed_server):
    url = keyed_server.base_url
    tenant, admin = {"Authorization": "Bearer key-alpha"}, {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.post(f"{url}/pause_generation", json={}, headers=tenant).status_code == 401
    assert httpx.get(f"{url}/is_paused", headers=tenant).status_code == 401
    assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}, headers=admin).status_code == 200
    assert httpx.post(f"{url}/continue_generation", json={}, headers=tenant).status_code == 401
    assert httpx.get(f"{url}/is_paused", headers=admin).json() == {"is_paused": True}
    assert httpx.post(f"{url}/continue_generation", json={}, headers=admin).status_code == 200
