import os

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
