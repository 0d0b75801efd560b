"""Attention over the paged KV cache, behind one small interface so kernels can be swapped."""

import importlib.util

import torch

from gpu.attention.base import AttentionBackend
from gpu.attention.torch_backend import TorchAttention
from gpu.config import ModelConfig

__all__ = ["AttentionBackend", "TorchAttention", "BACKENDS", "make_backend"]

BACKENDS = ("auto", "torch", "flashinfer", "triton")


def flashinfer_fits(config: ModelConfig, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether FlashInfer can serve this model here: CUDA, bf16/fp16, a head size it ships kernels for."""
    from gpu.attention.flashinfer_backend import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

    return (
        device.type == "cuda"
        and dtype in SUPPORTED_DTYPES
        and config.head_dim in SUPPORTED_HEAD_DIMS
        and importlib.util.find_spec("flashinfer") is not None
    )


def make_backend(
    name: str,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_graph_batch: int,
    max_model_len: int,
    block_size: int,
    deterministic: bool = False,
) -> AttentionBackend:
    """`auto` is FlashInfer where it fits (and imports), else our Triton kernels on CUDA, else (on the
    CPU) the torch reference. `deterministic` takes `auto` only: the batch-invariant kernels
    (gpu/invariant/attention.py) where Triton runs, else the torch reference, which attends a token
    at a time."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {', '.join(BACKENDS)}")
    scale = config.head_dim**-0.5
    if deterministic:
        return _deterministic_backend(name, config, dtype, device, max_graph_batch, max_model_len, block_size)
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttention(scale)
    heads = (config.num_attention_heads, config.num_key_value_heads, config.head_dim, scale, dtype)
    graph_buffers = dict(max_graph_batch=max_graph_batch, max_pages_per_seq=-(-max_model_len // block_size))
    if name == "flashinfer" or (name == "auto" and flashinfer_fits(config, dtype, device)):
        from gpu.attention.flashinfer_backend import FlashInferAttention

        try:
            return FlashInferAttention(*heads, device, **graph_buffers)
        except ImportError:
            if name == "flashinfer":
                raise
    from gpu.attention.triton_backend import TritonAttention

    return TritonAttention(*heads, device, **graph_buffers)


def _deterministic_backend(
    name: str,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_graph_batch: int,
    max_model_len: int,
    block_size: int,
) -> AttentionBackend:
    from gpu.invariant import runs_here

    if name != "auto":
        raise ValueError(
            f"attention backend {name!r} cannot serve --deterministic, which attends with its own "
            "batch-invariant kernels: leave the attention backend at auto"
        )
    if not runs_here(device):
        return TorchAttention(config.head_dim**-0.5)
    from gpu.invariant.attention import InvariantAttention

    return InvariantAttention(
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.head_dim**-0.5,
        dtype,
        device,
        max_graph_batch=max_graph_batch,
        max_pages_per_seq=-(-max_model_len // block_size),
        block_size=block_size,
    )
