"""The supervisor restarts what dies, gives up on a crash loop, and leaves nothing behind."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.e2e.server import start_server


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited but is not yet reaped: it counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def complete(server) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions",
                      json={"model": "demo", "prompt": "Hello", "max_tokens": 4}, timeout=60)


def wait_for_ready_restart(server, actor: str, starts: int = 2, timeout_s: float = 60) -> None:
    """After a kill: the supervisor starts process number `starts` of `actor`, which comes up."""
    server.wait_for("child_started", timeout_s=timeout_s, count=starts, child=actor)
    new_pid = server.child_pid(actor)
    server.wait_for("actor_started", timeout_s=timeout_s, pid=new_pid)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("supervised"), "--num-kv-blocks", "64")
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


def test_sigterm_stops_everything_in_order(tmp_path):
    server = start_server(tmp_path / "data", "--num-kv-blocks", "32")
    pids = {name: server.child_pid(name) for name in ("executor", "scheduler", "tokenizer", "frontdoor")}
    nats_pid = server.find("nats_started")[-1]["pid"]
    assert server.stop() == 0
    assert not any(alive(pid) for pid in [*pids.values(), nats_pid])
    order = [e["actor"] for e in server.events if e.get("event") == "actor_stopped"]
    assert order == ["frontdoor", "tokenizer", "scheduler", "executor"]


def test_gives_up_after_too_many_restarts(tmp_path):
    server = start_server(tmp_path / "data", "--num-kv-blocks", "32", "--max-restarts", "2", "--restart-period-s", "60")
    for attempt in range(3):
        pid = server.child_pid("tokenizer")
        os.kill(pid, signal.SIGKILL)
        if attempt < 2:
            wait_for_ready_restart(server, "tokenizer", starts=attempt + 2)
    assert server.process.wait(60) == 1
    assert server.find("giving_up", child="tokenizer")


def test_help_explains_every_flag():
    out = subprocess.run([sys.executable, "-m", "kernel.supervisor", "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--model", "--nats-url", "--port", "--log-format", "--max-restarts", "--max-prefill-tokens"):
        assert flag in out
