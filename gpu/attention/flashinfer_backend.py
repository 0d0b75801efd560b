"""Attention through FlashInfer's paged kernels: batch prefill (FA3 on Hopper) for steps with prompt
chunks, batch decode for decode-only steps, and one CUDA-graph decode wrapper per captured batch size.

The cache layer tensor [blocks, 2, block_size, kv_heads, head_dim] is FlashInfer's NHD layout, read
in place. Plans take the host copies of the indptr arrays (no device sync) and the device copy of
the page indices. flashinfer is imported here, so only when this backend is chosen.
"""

import numpy as np
import torch

from gpu.attention.base import AttentionBackend
from gpu.batch import ForwardBatch
from gpu.kv_cache import KVCache

SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
WORKSPACE_BYTES = 256 << 20  # split-KV partial results; shared by every wrapper, which run one at a time


class FlashInferAttention(AttentionBackend):
    supports_cuda_graphs = True

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        dtype: torch.dtype,
        device: torch.device,
        max_graph_batch: int = 0,
        max_pages_per_seq: int = 0,
    ) -> None:
        import flashinfer

        if head_dim not in SUPPORTED_HEAD_DIMS or dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"FlashInfer attention needs head_dim in {SUPPORTED_HEAD_DIMS} and bf16/fp16, "
                             f"got {head_dim} and {dtype}")
        self._flashinfer = flashinfer
        self._heads = (num_heads, num_kv_heads, head_dim)
        self._kwargs = dict(sm_scale=scale, q_data_type=dtype, kv_data_type=dtype, non_blocking=True)
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD", backend="fa2")
        # The graph wrappers' metadata lives in these buffers (sliced per size), at fixed addresses.
        self._graph_indptr = torch.zeros(max_graph_batch + 1, dtype=torch.int32, device=device)
        self._graph_last_page_len = torch.ones(max_graph_batch, dtype=torch.int32, device=device)
        self._graph_indices = torch.zeros(max(1, max_graph_batch * max_pages_per_seq), dtype=torch.int32, device=device)
        self._graph_decode: dict[int, object] = {}
        self._active = None
        self._decodes = 0  # of a mixed step: its first sequences, which decode (0: one kernel runs it all)
        self._empty = torch.empty(0, dtype=dtype)  # the planner takes the dtypes as empty tensors
        # Re-plan a captured size through the wrapper's compiled planner directly, skipping its
        # Python argument handling (see _replan_graph); False takes the public plan() every step.
        self.direct_graph_replan = True

    def prepare(self, batch: ForwardBatch) -> None:
        """Plans the step's attention: decode rows with the decode kernel, prompt chunks with the
        prefill kernel. A step that mixes them runs each kernel on its part when the one-token
        sequences come first (the running batch puts them there): the prefill kernel reads a
        decode's long KV several times slower than the decode kernel does."""
        query_lens = batch.host.query_lens
        decodes = batch.num_seqs if batch.host.is_decode else int(np.argmin(query_lens == 1))
        self._decodes = decodes if 0 < decodes < batch.num_seqs else 0
        self._active = None
        if decodes:
            pages = int(batch.host.kv_indptr[decodes])
            self._decode.plan(
                batch.host_kv_indptr[: decodes + 1], batch.kv_indices[:pages], batch.host_kv_last_page_len[:decodes],
                *self._heads, batch.block_size, pos_encoding_mode="NONE", **self._kwargs,
            )
            self._active = self._decode
        if decodes < batch.num_seqs:
            pages = batch.host_kv_indptr[decodes:]
            self._prefill.plan(
                batch.host_query_start[decodes:] - decodes, pages - pages[0], batch.kv_indices[int(pages[0]):],
                batch.host_kv_last_page_len[decodes:], *self._heads, batch.block_size, causal=True, **self._kwargs,
            )
            self._active = self._prefill

    def prepare_graph(self, batch: ForwardBatch) -> None:
        self._decodes = 0
        size = batch.num_seqs
        if size > len(self._graph_last_page_len):
            raise ValueError(f"no CUDA-graph decode buffers for batch {size}; built for {len(self._graph_last_page_len)}")
        wrapper = self._graph_decode.get(size)
        if wrapper is None:
            wrapper = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self._graph_indptr[: size + 1],
                paged_kv_indices_buffer=self._graph_indices,
                paged_kv_last_page_len_buffer=self._graph_last_page_len[:size],
                backend="fa2",
            )
            self._graph_decode[size] = wrapper
        elif self.direct_graph_replan:
            self._replan_graph(wrapper, batch)
            self._active = wrapper
            return
        wrapper.plan(
            batch.host_kv_indptr, batch.kv_indices, batch.host_kv_last_page_len, *self._heads, batch.block_size,
            pos_encoding_mode="NONE", **self._kwargs,
        )
        self._active = wrapper

    def _replan_graph(self, wrapper, batch: ForwardBatch) -> None:
        """What FlashInfer 0.7's BatchDecodeWithPagedKVCacheWrapper.plan does for a CUDA-graph wrapper
        of the CUDA-core decode kernel that was planned once already (same dtypes, heads, no window,
        no soft cap): fill the metadata buffers the graph reads and rerun the compiled planner, which
        rewrites the split-KV schedule in the int workspace. The graph's kernel arguments (workspace
        offsets) depend only on the batch size, fixed per wrapper."""
        wrapper._paged_kv_indptr_buf.copy_(batch.host_kv_indptr, non_blocking=True)
        wrapper._paged_kv_last_page_len_buf.copy_(batch.host_kv_last_page_len, non_blocking=True)
        wrapper._paged_kv_indices_buf[: batch.kv_indices.numel()].copy_(batch.kv_indices, non_blocking=True)
        num_heads, num_kv_heads, head_dim = self._heads
        empty = self._empty
        wrapper._plan_info = wrapper._cached_module.plan(
            wrapper._float_workspace_buffer, wrapper._int_workspace_buffer, wrapper._pin_memory_int_workspace_buffer,
            batch.host_kv_indptr, batch.num_seqs, num_heads, num_kv_heads, batch.block_size, True, -1, 0.0,
            head_dim, head_dim, empty, empty,
        )

    def attend(self, layer: int, q: torch.Tensor, kv: KVCache) -> torch.Tensor:
        # q: [T, heads, head_dim] -> [T, heads, head_dim]
        if not self._decodes:
            return self._active.run(q, kv.layers[layer])
        out = torch.empty_like(q)
        split = self._decodes  # the decodes' one token each come first
        self._decode.run(q[:split], kv.layers[layer], out=out[:split])
        self._prefill.run(q[split:], kv.layers[layer], out=out[split:])
        return out
