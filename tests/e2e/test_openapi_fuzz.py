"""Schemathesis drives the whole HTTP API from its own /openapi.json with every check it has
(`st run --checks all`: status codes, content types, headers, response schemas, schema-violating
requests refused, schema-valid ones taken, methods a path does not serve answered 405 with `Allow`,
no server error), and finds nothing: the document says what the server does.

`positive_data_acceptance` runs inside tests/e2e/openapi_rules.py's check, which lets through a
400 only where the document states, in words, the rule the schema cannot (a regex that compiles, a
prompt within the context window): it is excluded here by name so it does not run twice.

Two runs against one server with a short context (every generation stays short): first the routes
that serve requests, then, one request at a time, those that change what every other request meets
(pausing, sleeping, updating weights, joining a trainer's group), which would hold or abort the
first run's requests.

`/init_weights_update_group` makes the executor join the group at the address a body names, running
no step until every rank joined or the join timed out. So this server waits a second for the
trainer's ranks (`--weight-group-join-timeout-s`), not five minutes, and openapi_rules.py sends every
fuzzed body's address as one that no network routes: a valid body times out having reached nothing
and is answered 400, the body's other fields as generated (on a CPU the default `nccl` is refused at
once).
"""

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from ops.local_server import start_server

EXAMPLES_PER_ROUTE = 5
STATE_CHANGING = (
    "^/(abort_request|pause|resume|is_paused|pause_generation|continue_generation|update_weight|destroy_weights_update_group"
    "|get_weight|release_memory_occupation|resume_memory_occupation|sleep|wake_up|is_sleeping|flush_cache"
    "|reset_prefix_cache|init_weights_update_group)"
)
JOIN_TIMEOUT_S = 1
REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory):
    running = start_server(
        tmp_path_factory.mktemp("fuzz"),
        "--num-kv-blocks",
        "64",
        "--max-model-len",
        "16",
        "--weight-group-join-timeout-s",
        str(JOIN_TIMEOUT_S),
    )
    yield running
    running.stop()


def schemathesis_run(server, workdir: Path, *selection: str, workers: int) -> subprocess.CompletedProcess:
    command = [
        str(Path(sys.executable).with_name("st")),
        "run",
        f"{server.base_url}/openapi.json",
        "--checks=all",
        "--exclude-checks=positive_data_acceptance",
        "--max-response-time=60",  # a generous bound: max_response_time is among `all`, and wants one
        f"--max-examples={EXAMPLES_PER_ROUTE}",
        f"--workers={workers}",
        "--seed=1",
        "--request-timeout=60",
        "--generation-database=none",
        "--no-color",
        "--continue-on-failure",
        *selection,
    ]
    env = os.environ | {"SCHEMATHESIS_HOOKS": "tests.e2e.openapi_rules", "PYTHONPATH": str(REPO)}
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


def operations(server, chosen) -> int:
    """The document's operations on the paths `chosen`; schemathesis tests all but the document's own."""
    with urllib.request.urlopen(f"{server.base_url}/openapi.json") as response:
        paths = json.load(response)["paths"]
    return sum(len(item) for path, item in paths.items() if chosen(path) and path != "/openapi.json")


def assert_all_tested_and_passed(run: subprocess.CompletedProcess, expected: int) -> None:
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-20_000:]
    tested = re.search(r"Selected: (\d+)/\d+\s+Tested: (\d+)", output)
    assert tested and (int(tested.group(1)), int(tested.group(2))) == (expected, expected), output[-5_000:]


def test_every_check_passes_and_no_input_is_a_server_error(fuzzed_server, tmp_path):
    changes_state = re.compile(STATE_CHANGING).search
    served = schemathesis_run(fuzzed_server, tmp_path, f"--exclude-path-regex={STATE_CHANGING}", workers=2)
    assert_all_tested_and_passed(served, operations(fuzzed_server, lambda p: not changes_state(p)))
    changing = schemathesis_run(fuzzed_server, tmp_path, f"--include-path-regex={STATE_CHANGING}", workers=1)
    assert_all_tested_and_passed(changing, operations(fuzzed_server, changes_state))
