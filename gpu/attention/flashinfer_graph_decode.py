"""FlashInfer's decode wrappers for CUDA graphs: one per captured batch size, over metadata buffers
at fixed addresses, and the re-planning each replay needs.

A graph's kernel arguments point into these buffers and the shared workspace, so a replay only
refills the buffers and reruns the planner, which rewrites the split-KV schedule in the workspace.
"""

import torch

from gpu.attention.base import BackendInputs
from gpu.attention.graph_buffers import GraphDecodeBuffers


class GraphDecodes:
    """`plan_kwargs`: the scale and dtypes every plan takes."""

    def __init__(
        self, flashinfer, workspace: torch.Tensor, inputs: BackendInputs, plan_kwargs: dict, tensor_cores: bool
    ) -> None:
        self._flashinfer, self._workspace = flashinfer, workspace
        self._heads = (inputs.num_heads, inputs.num_kv_heads, inputs.head_dim)
        self._kwargs, self._tensor_cores = plan_kwargs, tensor_cores
        self.buffers = GraphDecodeBuffers(inputs.max_graph_batch, inputs.max_pages_per_seq, inputs.device)
        self.wrappers: dict[int, object] = {}  # batch size -> its wrapper
        self._row_indptr = torch.arange(inputs.max_graph_batch + 1, dtype=torch.int32)  # one query row per sequence
        self._empty = torch.empty(0, dtype=inputs.dtype)  # the planner takes dtypes as empty tensors
        # Re-plan a captured size through the wrapper's compiled planner directly, skipping its
        # Python argument handling (see _replan); False takes the public plan() every step.
        self.direct_replan = True

    def plan(self, size: int, indptr: torch.Tensor, indices: torch.Tensor, batch):
        """The wrapper of batch `size`, planned over `indptr` (host, pinned) and `indices` (device);
        made on the first call for a size, which is when its graph is captured."""
        wrapper = self.wrappers.get(size)
        if wrapper is not None and self.direct_replan:
            self._replan(wrapper, indptr, indices, batch)
            return wrapper
        if wrapper is None:
            buffers = self.buffers.sized(size)  # the wrapper's plans fill them
            wrapper = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=buffers.kv_indptr,
                paged_kv_indices_buffer=buffers.kv_indices,
                paged_kv_last_page_len_buffer=buffers.last_page_len,
                use_tensor_cores=self._tensor_cores,
                backend="fa2",
            )
            self.wrappers[size] = wrapper
        wrapper.plan(
            indptr,
            indices,
            batch.host_kv_last_page_len,
            *self._heads,
            batch.block_size,
            pos_encoding_mode="NONE",
            **self._kwargs,
        )
        return wrapper

    def _replan(self, wrapper, indptr: torch.Tensor, indices: torch.Tensor, batch) -> None:
        """What FlashInfer 0.7's BatchDecodeWithPagedKVCacheWrapper.plan does for a CUDA-graph wrapper
        that was planned once already (same dtypes, heads, no window, no soft cap): fill the metadata
        buffers the graph reads and rerun the compiled planner, which rewrites the split-KV schedule
        in the int workspace. The graph's kernel arguments (workspace offsets) depend only on the
        batch size, fixed per wrapper. `indptr` is on the host (pinned), `indices` on the device."""
        wrapper._paged_kv_indptr_buf.copy_(indptr, non_blocking=True)
        wrapper._paged_kv_last_page_len_buf.copy_(batch.host_kv_last_page_len, non_blocking=True)
        wrapper._paged_kv_indices_buf[: indices.numel()].copy_(indices, non_blocking=True)
        num_heads, num_kv_heads, head_dim = self._heads
        size, page = batch.num_seqs, batch.block_size
        workspaces = (
            wrapper._float_workspace_buffer,
            wrapper._int_workspace_buffer,
            wrapper._pin_memory_int_workspace_buffer,
        )
        if self._tensor_cores:  # the prefill planner, one query row per sequence (qo_indptr 0, 1, ..)
            # It takes the KV lengths too, though FlashInfer 0.7.2's fa2 planner schedules by pages.
            kv_lens = torch.clamp(indptr[1:] - indptr[:-1] - 1, min=0) * page + batch.host_kv_last_page_len
            wrapper._plan_info = wrapper._cached_module.plan(
                *workspaces,
                self._row_indptr[: size + 1],
                indptr,
                kv_lens,
                size,
                size,
                num_heads,
                num_kv_heads,
                page,  # query rows, sequences, heads, page size
                True,
                head_dim,
                head_dim,  # CUDA-graph mode, head dims of q/k and v
                False,
                -1,  # causal, window
                -1,
                False,
                0,
                0,  # fixed split size, split-KV off, colocated CTAs, uniform query length
            )
            return
        empty = self._empty
        wrapper._plan_info = wrapper._cached_module.plan(
            *workspaces,
            indptr,
            size,
            num_heads,
            num_kv_heads,
            page,
            True,
            -1,
            0.0,
            head_dim,
            head_dim,
            empty,
            empty,  # CUDA-graph mode, window, soft cap, head dims, dtypes
        )
