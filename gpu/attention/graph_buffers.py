"""The paged-KV metadata that CUDA-graph decodes read, kept by every backend that captures them.

A captured graph holds the addresses of its kernels' arguments, so the metadata a replay reads must
sit where it sat at capture: these buffers, allocated once for the largest graph batch, each batch
size reading their leading rows. A replay refills them.
"""

import torch

from gpu.attention.base import Paged
from gpu.forward_batch import ForwardBatch


class GraphDecodeBuffers:
    def __init__(self, max_batch: int, max_pages_per_seq: int, device: torch.device) -> None:
        self._kv_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, device=device)
        self._last_page_len = torch.ones(max_batch, dtype=torch.int32, device=device)
        self._kv_indices = torch.zeros(max(1, max_batch * max_pages_per_seq), dtype=torch.int32, device=device)

    @property
    def max_batch(self) -> int:
        return len(self._last_page_len)

    def sized(self, size: int) -> Paged:
        """The buffers a decode batch of `size` reads (kv_indices whole: its rows say how much)."""
        return Paged(self._kv_indptr[: size + 1], self._kv_indices, self._last_page_len[:size])

    def check_fits(self, batch: ForwardBatch) -> None:
        size, pages = batch.num_seqs, batch.kv_indices.numel()
        if size > self.max_batch or pages > len(self._kv_indices):
            raise ValueError(
                f"no CUDA-graph decode buffers for {size} sequences over {pages} pages; built for "
                f"{self.max_batch} sequences over {len(self._kv_indices)} pages"
            )

    def fill(self, batch: ForwardBatch) -> Paged:
        """Copies a padded decode batch's metadata in (without waiting on the device) -> the
        buffers its graph reads."""
        self.check_fits(batch)
        paged = self.sized(batch.num_seqs)
        paged.kv_indptr.copy_(batch.kv_indptr, non_blocking=True)
        paged.last_page_len.copy_(batch.kv_last_page_len, non_blocking=True)
        paged.kv_indices[: batch.kv_indices.numel()].copy_(batch.kv_indices, non_blocking=True)
        return paged
