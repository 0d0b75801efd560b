"""Attention over the paged KV cache, behind one small interface so kernels can be swapped."""

import importlib.util

from gpu.attention.base import AttentionBackend, BackendInputs
from gpu.attention.torch_backend import TorchAttention

__all__ = ["AttentionBackend", "BackendInputs", "TorchAttention", "BACKENDS", "make_backend"]

BACKENDS = ("auto", "torch", "flashinfer", "triton")


def flashinfer_fits(inputs: BackendInputs) -> bool:
    """Whether FlashInfer can serve these heads here: CUDA, bf16/fp16, a head size it ships kernels for."""
    from gpu.attention.flashinfer_backend import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

    return (
        inputs.device.type == "cuda"
        and inputs.dtype in SUPPORTED_DTYPES
        and inputs.head_dim in SUPPORTED_HEAD_DIMS
        and importlib.util.find_spec("flashinfer") is not None
    )


def make_backend(name: str, inputs: BackendInputs, deterministic: bool = False) -> AttentionBackend:
    """`auto` is FlashInfer where it fits (and imports), else our Triton kernels on CUDA, else (on the
    CPU) the torch reference. `deterministic` takes `auto` only: the batch-invariant kernels
    (gpu/invariant/attention.py) where Triton runs, else the torch reference, which attends a token
    at a time."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {', '.join(BACKENDS)}")
    if deterministic:
        return _deterministic_backend(name, inputs)
    if name == "torch" or (name == "auto" and inputs.device.type != "cuda"):
        return TorchAttention(inputs.scale)
    if name == "flashinfer" or (name == "auto" and flashinfer_fits(inputs)):
        from gpu.attention.flashinfer_backend import FlashInferAttention

        try:
            return FlashInferAttention(inputs)
        except ImportError:
            if name == "flashinfer":
                raise
    from gpu.attention.triton_backend import TritonAttention

    return TritonAttention(inputs)


def _deterministic_backend(name: str, inputs: BackendInputs) -> AttentionBackend:
    from gpu.invariant import runs_here

    if name != "auto":
        raise ValueError(
            f"attention backend {name!r} cannot serve --deterministic, which attends with its own "
            "batch-invariant kernels: leave the attention backend at auto"
        )
    if not runs_here(inputs.device):
        return TorchAttention(inputs.scale)
    from gpu.invariant.attention import InvariantAttention

    return InvariantAttention(inputs)
