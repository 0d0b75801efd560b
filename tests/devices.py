"""Where the device tests run, and the marks that skip them elsewhere. Without CUDA, Triton kernels
run in Triton's interpreter (tests/conftest.py turns it on before anything imports triton)."""

import os

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"  # where Triton kernels run

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_triton = pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="needs a CUDA GPU or TRITON_INTERPRET=1")
