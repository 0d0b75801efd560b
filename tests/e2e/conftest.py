import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.model_source import default_gguf
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
def converted_default_model(tmp_path_factory) -> Path:
    """The default model's GGUF file converted once per test run, by the module a server's first
    start runs, and shared by the run's test processes (pytest-xdist's workers): each would
    otherwise spend most of a minute of CPU converting the same file."""
    run_dir = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_dir = run_dir.parent  # the workers' temporary dirs lie side by side in the run's
    models = run_dir / "default-model"
    models.mkdir(exist_ok=True)
    with open(models / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first converts; another waits, then finds it converted
        converted = subprocess.run(
            [sys.executable, "-m", "gpu.gguf_import", str(default_gguf()), "--models-dir", str(models)],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
    return Path(converted.stdout.strip())


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory, converted_default_model):
    """The default model (a real chat model, converted from its GGUF file), served as the README's
    command serves it: the server finds the conversion in its data dir, as at a second start."""
    data_dir = tmp_path_factory.mktemp("chat")
    (data_dir / "models").mkdir()
    (data_dir / "models" / converted_default_model.name).symlink_to(converted_default_model)
    running = start_server(data_dir, "--num-kv-blocks", "128", model=None)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def chat_client(chat_server):
    from openai import OpenAI

    return OpenAI(base_url=f"{chat_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
