"""The supervisor restarts what dies, gives up on a crash loop, and leaves nothing behind."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import msgspec
import pytest

from actors.cache_tier.host_segment import SHM_DIR
from actors.scheduler.actor import ORPHAN_CHECK_S
from kernel.actor import HEARTBEAT_INTERVAL_S
from kernel.liveness import MISSED_BEATS
from kernel.nats_server import free_port
from ops.bus_client import stream_generate
from ops.local_server import json_objects, place_demo_model, start_server
from schemas.admin import GetStats, SchedulerStats
from schemas.generate import GenerateRequest, GenerateResult, SamplingParams


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited but is not yet reaped: it counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def complete(server) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/completions", json={"model": "demo", "prompt": "Hello", "max_tokens": 4}, timeout=60
    )


def wait_for_ready_restart(server, actor: str, starts: int = 2, timeout_s: float = 60) -> None:
    """After a kill: the supervisor starts process number `starts` of `actor`, which comes up."""
    server.wait_for("child_started", timeout_s=timeout_s, count=starts, child=actor)
    new_pid = server.child_pid(actor)
    server.wait_for("actor_started", timeout_s=timeout_s, pid=new_pid)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    running = start_server(
        tmp_path_factory.mktemp("supervised"),
        "--num-kv-blocks",
        "256",
        "--max-concurrent-requests",
        "3",
        "--no-prefix-caching",
    )
    yield running
    running.stop()


@pytest.mark.parametrize("actor", ["tokenizer", "frontdoor"])
def test_killed_actor_is_restarted_and_serves(own_server, actor):
    assert complete(own_server).status_code == 200
    old_pid = own_server.child_pid(actor)
    os.kill(old_pid, signal.SIGKILL)
    wait_for_ready_restart(own_server, actor)
    assert own_server.child_pid(actor) != old_pid
    deadline = time.monotonic() + 30
    while True:  # the HTTP port reopens with the new frontdoor
        try:
            response = complete(own_server)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


def test_prefix_caching_can_be_turned_off(own_server):
    wait_for(lambda: _answers(own_server), 60)
    body = {"model": "demo", "prompt": "The same long prompt, once more. " * 8, "max_tokens": 2}
    for _ in range(2):
        reply = httpx.post(f"{own_server.base_url}/v1/completions", json=body, timeout=60).json()
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert scheduler_stats(own_server).cached_blocks == 0


def test_gives_up_after_too_many_restarts(tmp_path):
    server = start_server(tmp_path / "data", "--num-kv-blocks", "32", "--max-restarts", "1", "--restart-period-s", "60")
    for attempt in range(2):
        pid = server.child_pid("tokenizer")
        os.kill(pid, signal.SIGKILL)
        if attempt < 1:
            wait_for_ready_restart(server, "tokenizer", starts=attempt + 2)
    assert server.process.wait(60) == 1
    assert server.find("giving_up", child="tokenizer")


def test_a_host_tier_larger_than_the_shared_memory_stops_the_server_at_once(tmp_path):
    """Not a crash loop: the executor's start would fail the same way each time."""
    stats = os.statvfs(SHM_DIR)
    blocks = (stats.f_bavail * stats.f_frsize >> 20) * 64  # the demo model's blocks are over 16 KiB
    data_dir = tmp_path / "data"
    place_demo_model(data_dir)
    command = [sys.executable, "-m", "kernel.supervisor", "--data-dir", str(data_dir), "--port", str(free_port())]
    command += ["--model", "demo", "--num-kv-blocks", "32", "--host-kv-blocks", str(blocks)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    events = [e for line in done.stderr.splitlines() for e in json_objects(line) or []]
    assert done.returncode == 1, done.stderr[-3000:]
    refused = [e for e in events if e.get("event") == "start_refused"]
    assert len(refused) == 1 and refused[0]["reason"].startswith(f"--host-kv-blocks {blocks}: ")
    assert [e["child"] for e in events if e.get("event") == "child_exited"] == []  # never restarted
    assert "supervisor: executor cannot start with these settings" in done.stderr


def test_each_child_has_its_own_restart_budget(tmp_path):
    """A budget of one restart each: three restarts, two of them of one actor's replicas, would
    exceed a budget shared by the deployment or by an actor's replicas."""
    server = start_server(
        tmp_path / "data",
        "--num-kv-blocks",
        "32",
        "--tokenizers",
        "2",
        "--max-restarts",
        "1",
        "--restart-period-s",
        "600",
    )
    for child in ("tokenizer", "tokenizer-2", "gateway"):
        os.kill(server.child_pid(child), signal.SIGKILL)
        wait_for_ready_restart(server, child, starts=2)
    assert not server.find("giving_up"), "three restarts, but none past its own child's budget of one"
    assert complete(server).status_code == 200
    os.kill(server.child_pid("gateway"), signal.SIGKILL)
    assert server.process.wait(60) == 1
    assert server.find("giving_up", child="gateway")


def test_help_explains_every_flag():
    out = subprocess.run(
        [sys.executable, "-m", "kernel.supervisor", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--model", "--nats-url", "--port", "--log-format", "--max-restarts", "--max-prefill-tokens"):
        assert flag in out


def scheduler_stats(server) -> SchedulerStats:
    """Over the bus, so it works while the frontdoor is down."""

    async def ask():
        nc = await server.connect_nats()
        reply = await nc.request("llm.admin.stats", msgspec.msgpack.encode(GetStats()), timeout=5)
        await nc.drain()
        return msgspec.msgpack.decode(reply.data, type=SchedulerStats)

    return asyncio.run(ask())


def start_streams(server, count: int) -> threading.Event:
    """Long streaming requests in the background; setting the returned event hangs them up."""
    hang_up = threading.Event()

    def stream():
        body = {"model": "demo", "prompt": "Go on", "max_tokens": 1500, "stream": True, "ignore_eos": True}
        try:
            with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
                for _ in response.iter_lines():
                    if hang_up.is_set():
                        return
        except httpx.HTTPError:
            pass  # the connection dies with the frontdoor

    for _ in range(count):
        threading.Thread(target=stream, daemon=True).start()
    return hang_up


def wait_for(condition, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(0.1)


def test_killed_frontdoor_frees_the_work_of_its_connections(own_server):
    start_streams(own_server, 3)
    wait_for(lambda: scheduler_stats(own_server).running == 3, 30)
    os.kill(own_server.child_pid("frontdoor"), signal.SIGKILL)
    started = time.monotonic()
    wait_for(lambda: scheduler_stats(own_server).running == 0, 10)
    assert time.monotonic() - started < 10
    stats = scheduler_stats(own_server)
    assert stats.waiting == 0
    assert own_server.find("orphans_aborted")


# How long after a kill the scheduler takes the frontdoor for dead, and aborts what its clients asked.
FRONTDOOR_TAKEN_FOR_DEAD_S = MISSED_BEATS * HEARTBEAT_INTERVAL_S + ORPHAN_CHECK_S + 0.5


def test_killed_frontdoor_leaves_bus_clients_alone(own_server):
    """Bus clients are served by the gateway, a process of its own: a stream over the bus runs on
    past the frontdoor's death and past the scheduler taking it for dead."""
    wait_for(lambda: _answers(own_server), 60)
    first_chunk = threading.Event()
    replies = []
    tokens = 3000  # at a few ms a token, it outlasts the wait below many times over

    async def over_bus():
        nc = await own_server.connect_nats()
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        async for reply in stream_generate(nc, GenerateRequest(text="Go on", params=params)):
            replies.append(reply)
            first_chunk.set()
        await nc.drain()

    client = threading.Thread(target=asyncio.run, args=(over_bus(),))
    client.start()
    assert first_chunk.wait(60)
    os.kill(own_server.child_pid("frontdoor"), signal.SIGKILL)
    time.sleep(FRONTDOOR_TAKEN_FOR_DEAD_S)
    assert not isinstance(replies[-1], GenerateResult), "the request ended before the frontdoor was taken for dead"
    client.join(120)
    result = replies[-1]
    assert isinstance(result, GenerateResult)
    assert result.completion_tokens == tokens
    assert [t for r in replies[:-1] for t in r.token_ids] == result.token_ids


def test_too_many_concurrent_requests_get_429(own_server):
    wait_for(lambda: _answers(own_server), 60)
    hang_up = start_streams(own_server, 3)
    wait_for(lambda: scheduler_stats(own_server).running == 3, 30)
    response = complete(own_server)
    hang_up.set()
    assert response.status_code == 429
    assert response.headers["Retry-After"]
    assert response.json()["error"]["type"] == "rate_limit_error"
    wait_for(lambda: scheduler_stats(own_server).running == 0, 10)
    assert complete(own_server).status_code == 200


def test_oversized_body_gets_413(own_server):
    wait_for(lambda: _answers(own_server), 60)
    response = httpx.post(
        f"{own_server.base_url}/v1/completions",
        content=b"{" + b" " * (5 * 1024 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413
    assert response.json()["error"]["message"]


def test_stuck_actor_is_detected_and_restarted(own_server):
    wait_for(lambda: _answers(own_server), 60)
    assert httpx.get(f"{own_server.base_url}/health/ready").status_code == 200
    pid = own_server.child_pid("tokenizer")
    starts = len(own_server.find("child_started", child="tokenizer"))
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: httpx.get(f"{own_server.base_url}/health/ready").status_code == 503, 10)
    assert "tokenizer" in httpx.get(f"{own_server.base_url}/health/ready").json()["not_ready"]
    # A request sent while no tokenizer is ready is held until one is, not refused.
    held: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: held.append(complete(own_server)))
    sender.start()
    own_server.wait_for("actor_stuck", timeout_s=15, child="tokenizer")
    wait_for_ready_restart(own_server, "tokenizer", starts=starts + 1)
    wait_for(lambda: httpx.get(f"{own_server.base_url}/health/ready").status_code == 200, 30)
    sender.join(60)
    assert [r.status_code for r in held] == [200], held and held[0].text
    assert complete(own_server).status_code == 200


def _answers(server) -> bool:
    try:
        return httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_sigterm_stops_everything_in_order(own_server):
    """The module's last test: it stops the module's server, whose children by now include restarted ones."""
    wait_for(lambda: _answers(own_server), 60)
    actors = ("executor", "cache_tier", "snapshot", "scheduler", "weight_sync", "tokenizer", "gateway", "frontdoor")
    pids = {name: own_server.child_pid(name) for name in actors}
    nats_pid = own_server.find("nats_started")[-1]["pid"]
    before_stop = len(own_server.events)
    assert own_server.stop() == 0
    assert not any(alive(pid) for pid in [*pids.values(), nats_pid])
    order = [e["actor"] for e in own_server.events[before_stop:] if e.get("event") == "actor_stopped"]
    assert order == list(reversed(actors))
    time.sleep(0.5)  # the log reader's last lines
    # A stop is no outage: the actors closing their own connections warn of nothing, nor does the supervisor.
    warned = [e["event"] for e in own_server.events[before_stop:] if e.get("level") in ("warning", "error")]
    assert warned == []
