"""The paged KV cache: a fixed pool of blocks per layer, indexed by the block ids the scheduler hands out.

Block `b`, offset `o` of a layer holds the K and V of one token at flat slot `b * block_size + o`;
which tokens those are is known only through the sequences' block tables.
"""

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Zeroed rather than empty: slots never written stay finite for kernels that mask by multiplying.
        self.layers = [  # each [2 (K, V), num_blocks, block_size, kv_heads, head_dim]
            torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return num_layers * 2 * block_size * num_kv_heads * head_dim * dtype.itemsize

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        # k, v: [T, kv_heads, head_dim]; slot_mapping: [T] int64 flat slots
        slots = self.layers[layer].flatten(1, 2)  # [2, num_blocks * block_size, kv_heads, head_dim], a view
        slots[0].index_copy_(0, slot_mapping, k)
        slots[1].index_copy_(0, slot_mapping, v)
