"""Schemathesis drives the whole HTTP API from its own OpenAPI document: no input makes a 5xx."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from ops.local_server import start_server

EXAMPLES_PER_ROUTE = 25


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory):
    # A short context keeps every generated request quick on a CPU.
    running = start_server(tmp_path_factory.mktemp("fuzz"), "--num-kv-blocks", "64", "--max-model-len", "48")
    yield running
    running.stop()


def operations(server):
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_no_input_makes_a_server_error(fuzzed_server):
    tested = []
    for operation in operations(fuzzed_server):

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_ROUTE, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def call(case):
            case.call_and_validate(checks=[not_a_server_error], timeout=60)

        call()
        tested.append(operation.label)
    assert "POST /v1/chat/completions" in tested and "POST /generate" in tested
