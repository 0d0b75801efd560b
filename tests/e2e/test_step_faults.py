"""Faults of the executor's steps, through a real server under load (16 streams, half over HTTP,
half over the bus, greedy and seeded), each stream compared with a run without the fault:
- steps the device has no memory for: the executor survives, retracts and retries smaller;
- a step that hangs: the executor's step watchdog reports it, `/health/ready` answers 503 saying
  why, and the supervisor restarts the executor.
In both, every stream completes with the output of the run without the fault.

The faults come from step_faults/sitecustomize.py, which wraps the model's forward pass in the
server's executor; the bus, the actors and the supervisor are the real ones.
"""

import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from ops.fault_drill import compare, failures, run_workload
from ops.local_server import start_server

NUM_REQUESTS = 16
MAX_TOKENS = 24
STEP_DEADLINE_S = 5


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("step_faults")


@pytest.fixture(scope="module")
def server(tmp_path_factory, faults):
    hook = Path(__file__).parent / "step_faults"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STEP_FAULTS_DIR", str(faults))
        env.setenv("PYTHONPATH", str(hook))
        running = start_server(
            tmp_path_factory.mktemp("kernel"), "--num-kv-blocks", "256", "--step-deadline-s", str(STEP_DEADLINE_S)
        )
    yield running
    running.stop()


@pytest.fixture(scope="module")
async def reference(server):
    """The same workload with no fault."""
    logs, _ = await run_workload(server, NUM_REQUESTS, MAX_TOKENS)
    assert not failures(logs)
    return logs


class ReadinessLog:
    """`/health/ready`'s answers, polled in a thread until stopped."""

    def __init__(self, base_url: str) -> None:
        self.answers: list[tuple[int, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(base_url,), daemon=True)
        self._thread.start()

    def _poll(self, base_url: str) -> None:
        while not self._stop.is_set():
            response = httpx.get(f"{base_url}/health/ready", timeout=5)
            self.answers.append((response.status_code, response.json()))
            time.sleep(0.1)

    def stop(self) -> list[tuple[int, dict]]:
        self._stop.set()
        self._thread.join()
        return self.answers


async def test_steps_out_of_memory_lose_nothing_and_the_executor_lives(server, reference, faults):
    pid = server.child_pid("executor")
    limit = faults / "oom_above_tokens"
    limit.write_text("16")  # from the prompts' first steps on; a decode step of every stream fits
    try:
        logs, _ = await run_workload(server, NUM_REQUESTS, MAX_TOKENS)
    finally:
        limit.unlink()
    assert server.find("step_out_of_memory"), "no step ran out of memory: nothing was tested"
    assert len(server.find("executor_out_of_memory")) == len(server.find("step_out_of_memory"))
    assert server.child_pid("executor") == pid and not server.find("child_exited")
    assert not failures(logs)
    assert compare(reference, logs) == (0, 0)
    assert all(log.completion_tokens == MAX_TOKENS for log in logs)


async def test_a_hung_step_is_seen_and_the_executor_restarted_losing_nothing(server, reference, faults):
    old_pid = server.child_pid("executor")
    readiness = ReadinessLog(server.base_url)
    logs, _ = await run_workload(server, NUM_REQUESTS, MAX_TOKENS, kill=(faults / "hang").touch)
    answers = readiness.stop()

    stuck = server.wait_for("actor_stuck", timeout_s=1, child="executor")
    assert stuck["pid"] == old_pid and "past the step deadline of 5 s" in stuck["reason"]
    assert server.child_pid("executor") != old_pid
    assert not failures(logs)
    assert compare(reference, logs) == (0, 0)
    assert all(log.completion_tokens == MAX_TOKENS for log in logs)

    reasons = [body["reasons"]["executor"] for status, body in answers if status == 503]
    assert any("past the step deadline" in reason for reason in reasons), reasons
    assert answers[0][0] == 200 and answers[-1][0] == 200
    assert not os.path.exists(faults / "hang")
