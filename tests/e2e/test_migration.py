"""Kill -9 an actor, or the nats-server, under load: every request completes, with no token lost or
repeated, and the same output as an uninterrupted run (greedy and seeded sampling alike)."""

import os
import signal

import pytest

from ops.fault_drill import compare, failures, run_workload
from ops.local_server import start_server

NUM_REQUESTS = 32
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory):
    # Two tokenizers: killing one moves its streams to the other (a queue group).
    running = start_server(tmp_path_factory.mktemp("faults"), "--num-kv-blocks", "512", "--tokenizers", "2")
    yield running
    running.stop()


@pytest.fixture(scope="module")
async def reference(faulty_server):
    """The same workload, uninterrupted."""
    logs, _ = await run_workload(faulty_server, NUM_REQUESTS, MAX_TOKENS)
    assert not failures(logs)
    return logs


@pytest.mark.parametrize("actor", ["tokenizer", "scheduler", "executor", "nats-server"])
async def test_kill_under_load_loses_nothing(faulty_server, reference, actor):
    old_pid = faulty_server.process_pids()[actor]
    logs, _ = await run_workload(faulty_server, NUM_REQUESTS, MAX_TOKENS, kill=lambda: os.kill(old_pid, signal.SIGKILL))
    assert faulty_server.process_pids()[actor] != old_pid, "the process was not restarted"
    assert not failures(logs)
    assert compare(reference, logs) == (0, 0)
    assert all(log.completion_tokens == MAX_TOKENS for log in logs)
    if actor in ("tokenizer", "scheduler"):  # the scheduler recomputes an executor's work itself
        assert faulty_server.find("request_migrating")
    if actor == "tokenizer":  # only the requests it tracked move; those without text it never saw
        migrated = {event["request_id"] for event in faulty_server.find("request_migrating")}
        assert not migrated & {log.request_id for log in logs if not log.detokenize}
