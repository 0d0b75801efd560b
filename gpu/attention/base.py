"""The contract between the model and an attention kernel.

Per step the model calls `prepare(batch)` once, then `attend` once per layer. The model writes the
step's new K/V into the cache (fused with the rotary embedding on the GPU) before it calls `attend`,
so a backend only reads the paged cache. Every backend is built from `BackendInputs`.
"""

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from gpu.config import ModelConfig
from gpu.forward_batch import ForwardBatch
from gpu.kv_cache import KVCache

PLAIN_GRAPH = "plain"  # the kind of decode graph every backend captures


class BackendInputs(NamedTuple):
    """What a backend is built for: the model's attention heads, their dtype and device, and the
    decode batches captured in CUDA graphs, whose metadata buffers it keeps."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    max_graph_batch: int = 0  # the largest decode batch a graph is captured for; 0: none
    max_pages_per_seq: int = 0  # the most blocks one sequence of a graph's batch reads
    block_size: int = 16  # tokens per block of the paged cache

    @classmethod
    def for_model(
        cls,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        block_size: int,
        max_model_len: int,
        max_graph_batch: int,
    ) -> "BackendInputs":
        """Sized for sequences of up to `max_model_len` tokens."""
        return cls(
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            dtype,
            device,
            max_graph_batch,
            max_pages_per_seq=-(-max_model_len // block_size),
            block_size=block_size,
        )

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


class Paged(NamedTuple):
    """Where the step's sequences' keys are: the paged-KV metadata the kernels read."""

    kv_indptr: torch.Tensor  # [S+1] int32: sequence s's blocks are kv_indices[kv_indptr[s]:kv_indptr[s+1]]
    kv_indices: torch.Tensor  # [P] int32
    last_page_len: torch.Tensor  # [S] int32: tokens in each sequence's last block


class AttentionBackend(ABC):
    # True when `attend` can be captured in a CUDA graph after `prepare_graph`.
    supports_cuda_graphs: bool = False

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Plans the step (index tensors, masks, kernel plans) from the batch's metadata; the plan
        holds until the next `prepare`."""

    @abstractmethod
    def attend(self, layer: int, q: torch.Tensor, kv: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention of each new token over its sequence's cached tokens, the new ones
        included (already written to the cache), written into `out` when given (contiguous, of q's
        shape and dtype: a buffer at a fixed address, which a CUDA graph reads; saves a copy) and
        returned.

        q: [T, heads, head_dim], RoPE applied -> [T, heads, head_dim]
        """

    def graph_kinds(self, size: int) -> tuple[str, ...]:
        """The kinds of CUDA graph to capture for decode batches of `size`: one per way the backend
        may plan such a batch, each a different sequence of kernels."""
        return (PLAIN_GRAPH,)

    def prepare_graph(self, batch: ForwardBatch, kind: str | None = None) -> str:
        """Plans a padded decode batch for the CUDA graph captured at its size: the plan must land
        in buffers whose addresses the captured graph holds. `kind` None lets the backend pick the
        kind that serves this batch best; returns the kind planned for."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")
