"""The bus is locked: the embedded nats-server admits only the users the supervisor wrote, each
actor's user only on its own subjects, and other services as `client`, on the public API alone."""

import asyncio
import json
import signal
import stat
import subprocess
import sys

import httpx
import msgspec
import nats
import nats.errors
import pytest

from kernel import bus_auth
from kernel.nats_server import EmbeddedNats
from ops.local_server import start_server
from schemas.admin import GetStats, SchedulerStats
from schemas.errors import Error
from schemas.generate import GenerateRequest, GenerateResult, SamplingParams
from tests.e2e.nats_probe import PROBE, Connection

ACTORS = ("executor", "cache_tier", "snapshot", "scheduler", "weight_sync", "tokenizer", "gateway", "frontdoor")


def credentials(server, user: str) -> bus_auth.BusCredentials:
    return bus_auth.load_credentials(bus_auth.credentials_path(server.data_dir, user))


async def test_a_connection_without_credentials_is_refused(server):
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.nats_url, allow_reconnect=False, connect_timeout=5)


async def test_a_wrong_password_is_refused(server):
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            server.nats_url, user="client", password="not-the-password", allow_reconnect=False, connect_timeout=5
        )


async def test_the_client_user_can_generate_and_read_stats(server):
    nc = await server.connect_nats()
    request = GenerateRequest(text="Hello", params=SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    reply = await nc.request("llm.generate", msgspec.msgpack.encode(request), timeout=60)
    result = msgspec.msgpack.decode(reply.data, type=GenerateResult | Error)
    assert isinstance(result, GenerateResult) and result.completion_tokens == 4
    stats = await nc.request("llm.admin.stats", msgspec.msgpack.encode(GetStats()), timeout=10)
    assert isinstance(msgspec.msgpack.decode(stats.data, type=SchedulerStats | Error), SchedulerStats)
    await nc.drain()


async def test_the_client_user_cannot_read_or_write_internal_subjects(server):
    client = await Connection.open(server.nats_url, server.client_credentials)
    steps = await client.nc.subscribe("llm.executor.steps")
    await client.nc.publish("llm.scheduler.requests", b"\x80")
    await client.settle()
    assert 'nats: permissions violation for subscription to "llm.executor.steps"' in client.errors
    assert 'nats: permissions violation for publish to "llm.scheduler.requests"' in client.errors
    nc = await server.connect_nats()  # steps flow while a request runs: none reaches the refused subscription
    request = GenerateRequest(text="Hello", params=SamplingParams(max_tokens=4, ignore_eos=True))
    await nc.request("llm.generate", msgspec.msgpack.encode(request), timeout=60)
    await nc.drain()
    with pytest.raises(nats.errors.TimeoutError):
        await steps.next_msg(timeout=0.5)
    await client.close()


async def test_an_actor_user_cannot_publish_outside_its_subjects(server):
    tokenizer = await Connection.open(server.nats_url, credentials(server, "tokenizer"))
    await tokenizer.nc.publish("llm.executor.commands", b"\x80")
    await tokenizer.nc.subscribe("llm.inbox.scheduler.>")  # another actor's replies
    await tokenizer.settle()
    assert 'nats: permissions violation for publish to "llm.executor.commands"' in tokenizer.errors
    assert 'nats: permissions violation for subscription to "llm.inbox.scheduler.>"' in tokenizer.errors
    await tokenizer.close()


def test_credential_files_are_private(server):
    bus_dir = server.data_dir / "bus"
    assert stat.S_IMODE(bus_dir.stat().st_mode) == 0o700
    files = sorted(p.name for p in bus_dir.iterdir())
    assert files == [
        "cache_tier.json",
        "client.json",
        "executor.json",
        "frontdoor.json",
        "gateway.json",
        "nats-server.conf",
        "scheduler.json",
        "snapshot.json",
        "supervisor.json",
        "tokenizer.json",
        "weight_sync.json",
    ]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in bus_dir.iterdir())


def test_no_secret_is_on_a_command_line(server):
    passwords = {credentials(server, user).password for user in (*ACTORS, "supervisor", "client")}
    for actor in ACTORS:
        with open(f"/proc/{server.child_pid(actor)}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        assert argv[argv.index("--nats-credentials") + 1] == str(bus_auth.credentials_path(server.data_dir, actor))
        assert not passwords & set(argv)


def test_an_actor_started_by_hand_connects_with_its_file(server):
    own_file = bus_auth.credentials_path(server.data_dir, "tokenizer")
    command = [
        sys.executable,
        "-m",
        "actors.tokenizer",
        "--model",
        str(server.model_dir),
        "--nats-url",
        server.nats_url,
        "--nats-credentials",
        str(own_file),
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        events = []
        for line in process.stderr:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a library's warning
            if events[-1]["event"] == "actor_started":
                break
        assert events and events[-1]["event"] == "actor_started"
        assert not [e for e in events if e["event"] == "bus_error"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


def test_no_actor_was_refused_anything(server):
    """Every subject an actor uses is in its grant: the deployment that served the tests above saw
    no permission violation but this file's own."""
    assert not [e for e in server.find("bus_error") if "permissions violation" in e.get("error", "")]
    server_log = (server.data_dir / "nats-server.log").read_text().splitlines()
    assert [line for line in server_log if "Violation" in line and PROBE in line]
    assert not [line for line in server_log if "Violation" in line and PROBE not in line]


def write_single_user_server_config(path, password: str) -> None:
    """An external server of the operator's, with one user that may do anything."""
    path.write_text(json.dumps({"authorization": {"users": [{"user": "deployment", "password": password}]}}))


async def test_an_external_server_with_credentials_from_the_flag(tmp_path):
    (tmp_path / "nats").mkdir()
    config_path = tmp_path / "nats" / "server.conf"
    write_single_user_server_config(config_path, "external-secret")
    credentials_file = tmp_path / "deployment.json"
    credentials_file.write_text(json.dumps({"user": "deployment", "password": "external-secret"}))
    nats_server = EmbeddedNats(tmp_path / "nats", config_file=config_path)
    await nats_server.start()
    try:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(nats_server.url, allow_reconnect=False, connect_timeout=5)
        server = await asyncio.to_thread(
            start_server,
            tmp_path / "data",
            "--nats-url",
            nats_server.url,
            "--nats-credentials",
            str(credentials_file),
            "--num-kv-blocks",
            "64",
        )
        try:
            response = await asyncio.to_thread(
                httpx.post,
                f"{server.base_url}/v1/completions",
                json={"model": "demo", "prompt": "Hello", "max_tokens": 4},
                timeout=60,
            )
            assert response.status_code == 200, response.text
            assert not (tmp_path / "data" / "bus").exists(), "an external server needs no credentials of ours"
        finally:
            await asyncio.to_thread(server.stop)
    finally:
        await nats_server.stop()
