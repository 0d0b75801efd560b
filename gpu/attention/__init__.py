"""Attention over the paged KV cache, behind one small interface so kernels can be swapped."""

from gpu.attention.base import AttentionBackend
from gpu.attention.torch_backend import TorchAttention

__all__ = ["AttentionBackend", "TorchAttention"]
