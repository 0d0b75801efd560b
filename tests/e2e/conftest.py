import pytest

from ops.local_server import start_server


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One deployment shared by the end-to-end tests that do not kill anything."""
    running = start_server(tmp_path_factory.mktemp("kernel"), "--num-kv-blocks", "256")
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
