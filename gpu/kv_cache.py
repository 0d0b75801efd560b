"""The paged KV cache: a fixed pool of blocks per layer, indexed by the block ids the scheduler hands out.

Each layer is a tensor [num_blocks + 1, 2 (K, V), block_size, kv_heads, head_dim], FlashInfer's
NHD paged layout, so its kernels read it as it is. The layers are views of one allocation, so that
a block of every layer is gathered or scattered in one operation (`rows`), not one per layer. Token slot `b * block_size + o` is block `b`,
offset `o`; which tokens those are is known only through the sequences' block tables. One block past
`num_blocks` is scratch that no sequence owns: padded rows of a CUDA-graph batch write there.
While the server sleeps the pool is released, its memory back with the driver, and later
reallocated empty (gpu/memory_occupation.py).
"""

import torch

from gpu.layer_arrivals import LayerArrivals

CPU_KV_CACHE_BYTES = 256 << 20
CUDA_KV_CACHE_FRACTION = 0.85  # of the memory free once the weights are in; the rest is for activations


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
        self.num_blocks = num_blocks  # the blocks the scheduler may hand out: ids 0 ..< num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks
        # Zeroed rather than empty: slots never written stay finite for kernels that mask by multiplying.
        self._pool = torch.zeros(  # [num_layers, num_blocks + 1, 2, block_size, kv_heads, head_dim]
            num_layers, num_blocks + 1, 2, block_size, num_kv_heads, head_dim, dtype=dtype, device=device
        )
        self.layers = list(self._pool.unbind(0))  # each [num_blocks + 1, 2, block_size, kv_heads, head_dim]
        self.arrivals = LayerArrivals()  # loads from the host tier still landing, layer by layer

    @property
    def released(self) -> bool:
        return self._pool.untyped_storage().nbytes() == 0

    @property
    def block_bytes(self) -> int:
        """One block of every layer, K and V: what a block costs the pool, and a host slot's size."""
        return len(self.layers) * self.layers[0][0].numel() * self.layers[0].element_size()

    @property
    def nbytes(self) -> int:
        """The device bytes the pool holds now (none while released)."""
        return self._pool.untyped_storage().nbytes()

    def release(self) -> None:
        """Frees the pool's memory (to torch's cache: `torch.cuda.empty_cache` gives it to the driver)
        and forgets its content. The layer tensors stay, sized to nothing, until `reallocate`."""
        self._pool.untyped_storage().resize_(0)

    def reallocate(self) -> None:
        """Gives a released pool memory again, zeroed as at the start; its addresses may differ, so
        whatever captured them (CUDA graphs) must be captured again."""
        if self.released:
            self._pool.untyped_storage().resize_(self._pool.numel() * self._pool.element_size())
            self._pool.zero_()

    @property
    def rows(self) -> torch.Tensor:
        """The pool as rows of one layer's block: [num_layers * (num_blocks + 1), 2 * block_size *
        kv_heads * head_dim], row `layer * (num_blocks + 1) + block` (`row_ids`), a view."""
        return self._pool.view(len(self.layers) * (self.num_blocks + 1), -1)

    def row_ids(self, blocks: torch.Tensor) -> torch.Tensor:
        """The `rows` of `blocks` (int64 ids, on the device whose work uses the rows: they are made
        there, from the ids alone), block by block, each block's layers in order: gathered in this
        order they lie as blocks of every layer, [len(blocks), num_layers, ...]."""
        layers = torch.arange(len(self.layers), device=blocks.device) * (self.num_blocks + 1)
        return (blocks[:, None] + layers).view(-1)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return num_layers * 2 * block_size * num_kv_heads * head_dim * dtype.itemsize

    def keys(self, layer: int) -> torch.Tensor:
        return self.layers[layer][:, 0]  # [num_blocks + 1, block_size, kv_heads, head_dim], a view

    def values(self, layer: int) -> torch.Tensor:
        return self.layers[layer][:, 1]

    def copy_blocks(self, sources: list[int], targets: list[int]) -> None:
        """Block `targets[i]` becomes a copy of block `sources[i]`, in every layer."""
        self.arrivals.settle()  # a source may be a block still landing
        device = self._pool.device
        source = self.row_ids(torch.tensor(sources, dtype=torch.long, device=device))
        target = self.row_ids(torch.tensor(targets, dtype=torch.long, device=device))
        self.rows.index_copy_(0, target, self.rows.index_select(0, source))

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        # k, v: [T, kv_heads, head_dim]; slot_mapping: [T] flat slots. The fused GPU path writes in
        # gpu.kernels.rope_store_kv instead.
        cache = self.layers[layer]
        rows = cache.view(-1, *cache.shape[3:])  # [(num_blocks + 1) * 2 * block_size, kv_heads, head_dim]
        slots = slot_mapping.long()
        k_rows = slots + (slots // self.block_size) * self.block_size  # block * 2 * block_size + offset
        rows.index_copy_(0, k_rows, k)
        rows.index_copy_(0, k_rows + self.block_size, v)

    @classmethod
    def for_model(
        cls,
        config,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        num_kv_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
    ) -> "KVCache":
        """A pool for `config`'s KV of `num_kv_blocks` blocks, or of as many as fit in `kv_cache_bytes`
        (`blocks_that_fit`). Raises ValueError when that is none."""
        if num_kv_blocks is None:
            num_kv_blocks = cls.blocks_that_fit(config, block_size, dtype, device, kv_cache_bytes)
        if num_kv_blocks < 1:
            raise ValueError("the KV cache has room for no block; give num_kv_blocks or more kv_cache_bytes")
        layers, heads, head_dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        return cls(layers, num_kv_blocks, block_size, heads, head_dim, dtype, device)

    @staticmethod
    def blocks_that_fit(
        config, block_size: int, dtype: torch.dtype, device: torch.device, kv_cache_bytes: int | None
    ) -> int:
        """How many blocks of `config`'s KV fit in `kv_cache_bytes`; by default in most of the device's
        free memory on CUDA (what is left holds the activations), in a fixed budget on the CPU."""
        per_block = KVCache.bytes_per_block(
            config.num_hidden_layers, block_size, config.num_key_value_heads, config.head_dim, dtype
        )
        if kv_cache_bytes is None:
            if device.type == "cuda":
                free_bytes, _total = torch.cuda.mem_get_info(device)
                kv_cache_bytes = int(free_bytes * CUDA_KV_CACHE_FRACTION)
            else:
                kv_cache_bytes = CPU_KV_CACHE_BYTES
        return kv_cache_bytes // per_block
