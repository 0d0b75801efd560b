import os

# One thread per torch process: here, and in every server a test starts (they inherit it). The test
# models are small, and the machine few-cored: with torch's default of a thread per core, an
# executor's threads spin against the test's client and the other actors, and each step takes up to
# ten times as long. Set before torch is imported, which reads it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

# Without CUDA, Triton kernels run only in Triton's interpreter: set it before anything imports
# triton, so the kernel tests (tests/gpu/test_kernels.py, test_triton_attention.py) run on CPU too.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest


@pytest.fixture(scope="session")
def build_tiny_model(tmp_path_factory):
    """Builds (once per session) a tiny random-weight model of an architecture; returns its dir."""
    from gpu.model_builder import build_model_dir

    root = tmp_path_factory.mktemp("tiny-models")
    built = {}

    def build(arch: str):
        if arch not in built:
            built[arch] = build_model_dir(root / arch, arch=arch, size="tiny", seed=3)
        return built[arch]

    return build


@pytest.fixture
async def nats_url(tmp_path):
    """A real nats-server of the test's own, for code that talks over the bus (no fake bus)."""
    from kernel.nats_server import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    yield server.url
    await server.stop()
