"""The contract between the model and an attention kernel.

Per step the model calls `prepare(batch)` once, then `attend` once per layer. A backend writes
the new K/V into the cache itself, since fast kernels fuse that write or need their own layout.
"""

from abc import ABC, abstractmethod

import torch

from gpu.batch import ForwardBatch
from gpu.kv_cache import KVCache


class AttentionBackend(ABC):
    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Plans the step (index tensors, masks, kernel plans) from the batch's metadata; the plan
        holds until the next `prepare`."""

    @abstractmethod
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """Writes the new tokens' K/V of `layer` to their slots, then returns causal attention of each
        new token over its sequence's cached and new tokens.

        q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim], RoPE applied -> [T, heads, head_dim]
        """
