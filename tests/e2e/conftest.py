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


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory):
    """The default model (a real chat model, converted from its GGUF file on this first start: once
    per test run), served as the README's command serves it."""
    running = start_server(tmp_path_factory.mktemp("chat"), "--num-kv-blocks", "128", model=None)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def chat_client(chat_server):
    from openai import OpenAI

    return OpenAI(base_url=f"{chat_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
