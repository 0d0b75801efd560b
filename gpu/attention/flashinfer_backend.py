"""Attention through FlashInfer's paged kernels: batch prefill (FA3 on Hopper) for steps with prompt
chunks, batch decode (on tensor cores where a KV head serves 4+ query heads) for decode-only steps, and one
CUDA-graph decode wrapper per captured batch size.
Where many decoding sequences share leading blocks, their step reads those blocks once (see
shared_prefix.py), eagerly and in graphs of a second kind captured for that.

The cache layer tensor [blocks, 2, block_size, kv_heads, head_dim] is FlashInfer's NHD layout, read
in place. Plans take the host copies of the indptr arrays (no device sync) and the device copy of
the page indices. flashinfer is imported here, so only when this backend is chosen.
"""

from dataclasses import replace
from typing import Generic, NamedTuple

import numpy as np
import torch

from gpu.attention.base import PLAIN_GRAPH, AttentionBackend, BackendInputs
from gpu.attention.flashinfer_graph_decode import GraphDecodes
from gpu.attention.flashinfer_prefill import PagedPrefill
from gpu.attention.shared_prefix import (
    MAX_GROUPS,
    MIN_SPARED_TOKEN_READS,
    SharedPrefixes,
    find_shared_prefixes,
    merge_attention_states,
)
from gpu.forward_batch import ForwardBatch
from gpu.kv_cache import KVCache
from gpu.staging import Array, Staging

SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
WORKSPACE_BYTES = 256 << 20  # split-KV partial results; shared by every wrapper, which run one at a time
SHARED_PREFIX_GRAPH = "shared_prefix"  # the graph kind whose decode reads a shared prefix once
# Where a KV head serves this many query heads or more, decode runs FlashInfer's tensor-core kernel
# (its prefill kernel over one query row per sequence) rather than its CUDA-core decode kernel. The
# kernel stacks a KV head's query heads as the rows of its matrix products, so with fewer of them
# most rows are padding; groups of 2 (qwen3-0.6b) were not measured and stay on CUDA cores. At 4
# (llama-3.1-8b) a large batch's step is a few percent quicker, batch 1 no slower
# (docs/journal/benchmarks.md, section "Decode on tensor cores"). Its module is not in the GPU kit's
# prebuilt set: a fresh machine builds it in tens of seconds at the first decode plan.
TENSOR_CORE_DECODE_MIN_GROUP = 4


class _PrefixPassArrays(NamedTuple, Generic[Array]):
    """A shared-prefix plan (`SharedPrefixes`) as it is uploaded: the prefix pass's requests, then
    what the decode pass reads besides."""

    query_indptr: Array  # [G+1] int32: group g's rows in `order`
    pages_indptr: Array  # [G+1] int32: group g's shared blocks in `pages`
    pages: Array  # [P] int32
    last_page_len: Array  # [G] int32: block_size, a shared block is full
    order: Array  # [rows] int32: the decode rows in the prefix pass's order
    slots: Array  # [rows] int32: each row's place in the prefix pass, -1 where it shares nothing
    suffix_indptr: Array  # [rows+1] int32
    suffix_indices: Array  # [Q] int32


class FlashInferAttention(AttentionBackend):
    supports_cuda_graphs = True

    def __init__(self, inputs: BackendInputs) -> None:
        import flashinfer

        if inputs.head_dim not in SUPPORTED_HEAD_DIMS or inputs.dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"FlashInfer attention needs head_dim in {SUPPORTED_HEAD_DIMS} and bf16/fp16, "
                f"got {inputs.head_dim} and {inputs.dtype}"
            )
        dtype, device = inputs.dtype, inputs.device
        self._flashinfer = flashinfer
        self._heads = (inputs.num_heads, inputs.num_kv_heads, inputs.head_dim)
        self._kwargs = dict(sm_scale=inputs.scale, q_data_type=dtype, kv_data_type=dtype, non_blocking=True)
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._prefill = PagedPrefill(flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD"))
        self.decode_tensor_cores = inputs.num_heads // inputs.num_kv_heads >= TENSOR_CORE_DECODE_MIN_GROUP
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace,
            "NHD",
            use_tensor_cores=self.decode_tensor_cores,
            backend="fa2",
        )
        self._shared_prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        # The shared-prefix plans' own arrays (suffix pages, the prefix, who shares) reach the device here.
        self._staging = Staging(device)
        self.graph_decodes = GraphDecodes(flashinfer, self._workspace, inputs, self._kwargs, self.decode_tensor_cores)
        # A shared-prefix graph's prefix pass is MAX_GROUPS requests (the unused ones empty), over
        # the decode rows in the order the plan puts them.
        self._graph_prefix_buffers = dict(
            qo_indptr_buf=torch.zeros(MAX_GROUPS + 1, dtype=torch.int32, device=device),
            paged_kv_indptr_buf=torch.zeros(MAX_GROUPS + 1, dtype=torch.int32, device=device),
            paged_kv_indices_buf=torch.zeros(
                max(1, MAX_GROUPS * inputs.max_pages_per_seq), dtype=torch.int32, device=device
            ),
            paged_kv_last_page_len_buf=torch.ones(MAX_GROUPS, dtype=torch.int32, device=device),
        )
        self._graph_order = torch.zeros(max(1, inputs.max_graph_batch), dtype=torch.int32, device=device)
        self._graph_slots = torch.zeros(max(1, inputs.max_graph_batch), dtype=torch.int32, device=device)
        self._graph_prefix: dict[int, object] = {}
        # The step's plan: its first `_decodes` sequences decode with `_decode_run`, the rest (if
        # any) are prompt chunks for `_prefill`. When groups of the decodes share leading blocks,
        # `_prefix_run` attends the rows `_order` picks over them and `_slots` says where each
        # decode row's result from that pass is.
        self._decodes = 0
        self._decode_run = None
        self._prefix_run = None
        self._order: torch.Tensor | None = None
        self._slots: torch.Tensor | None = None
        # A shared prefix is read once when that spares at least this many token reads a layer.
        self.min_spared_token_reads = MIN_SPARED_TOKEN_READS

    def prepare(self, batch: ForwardBatch) -> None:
        """Plans the step's attention: decode rows with the decode kernel, prompt chunks with the
        prefill kernel. A step that mixes them runs each kernel on its part when the one-token
        sequences come first (the running batch puts them there): the prefill kernel reads a
        decode's long KV several times slower than the decode kernel does."""
        host = batch.host
        decodes = batch.num_seqs if host.is_decode else int(np.argmin(host.query_lens == 1))
        self._decodes, self._decode_run, self._prefix_run = decodes, None, None
        if decodes:
            shared = find_shared_prefixes(host, decodes, self.min_spared_token_reads)
            if shared is None:
                pages = int(host.kv_indptr[decodes])
                indptr, indices = batch.host_kv_indptr[: decodes + 1], batch.kv_indices[:pages]
            else:
                indptr, indices = self._plan_prefix_pass(shared, self._shared_prefill, batch.block_size)
                self._order = self._order[: int(shared.query_indptr[-1])]  # eagerly, the pass takes its rows only
            self._decode.plan(
                indptr,
                indices,
                batch.host_kv_last_page_len[:decodes],
                *self._heads,
                batch.block_size,
                pos_encoding_mode="NONE",
                **self._kwargs,
            )
            self._decode_run = self._decode
            self._staging.release()  # the plans have enqueued their reads of its pinned arrays
        if decodes < batch.num_seqs:
            pages = batch.host_kv_indptr[decodes:]
            self._prefill.plan(
                batch.host_query_start[decodes:] - decodes,
                pages - pages[0],
                batch.kv_indices[int(pages[0]) :],
                batch.host_kv_last_page_len[decodes:],
                *self._heads,
                batch.block_size,
                causal=True,
                **self._kwargs,
            )

    def graph_kinds(self, size: int) -> tuple[str, ...]:
        return (PLAIN_GRAPH, SHARED_PREFIX_GRAPH) if size >= 2 else (PLAIN_GRAPH,)

    def prepare_graph(self, batch: ForwardBatch, kind: str | None = None) -> str:
        size = batch.num_seqs
        self.graph_decodes.buffers.check_fits(batch)
        if kind is None:  # replaying: only a kind captured at this size may be chosen
            shared = None
            if size in self._graph_prefix:
                shared = find_shared_prefixes(batch.host, size, self.min_spared_token_reads)
            kind = PLAIN_GRAPH if shared is None else SHARED_PREFIX_GRAPH
        elif kind == SHARED_PREFIX_GRAPH:  # capturing
            shared = self._capture_plan(batch)
        elif kind != PLAIN_GRAPH:
            raise ValueError(
                f"unknown CUDA-graph kind {kind!r}; this backend captures {PLAIN_GRAPH!r} and {SHARED_PREFIX_GRAPH!r}"
            )
        self._decodes, self._prefix_run = size, None
        if kind == PLAIN_GRAPH:
            indptr, indices = batch.host_kv_indptr, batch.kv_indices
        else:
            prefix_run = self._graph_prefix.get(size)
            if prefix_run is None:
                prefix_run = self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    self._workspace,
                    "NHD",
                    use_cuda_graph=True,
                    **self._graph_prefix_buffers,
                )
                self._graph_prefix[size] = prefix_run
            indptr, indices = self._plan_prefix_pass(_padded_to_max_groups(shared), prefix_run, batch.block_size)
            self._graph_order[:size].copy_(self._order, non_blocking=True)
            self._graph_slots[:size].copy_(self._slots, non_blocking=True)
            self._order, self._slots = self._graph_order[:size], self._graph_slots[:size]
        self._decode_run = self.graph_decodes.plan(size, indptr, indices, batch)
        self._staging.release()  # the plans have enqueued their reads of its pinned arrays
        return kind

    @staticmethod
    def _capture_plan(batch: ForwardBatch) -> SharedPrefixes:
        """A plan to capture a shared-prefix graph with: every row in the first group, over one block
        that no row merges (the pass must be captured at the most rows it will take)."""
        host, size = batch.host, batch.num_seqs
        return SharedPrefixes(
            order=np.arange(size, dtype=np.int32),
            query_indptr=np.array([0, size], np.int32),
            pages_indptr=np.array([0, 1], np.int32),
            pages=host.kv_indices[:1],
            slots=np.full(size, -1, np.int32),
            suffix_indptr=host.kv_indptr,
            suffix_indices=host.kv_indices,
        )

    def _plan_prefix_pass(self, shared: SharedPrefixes, prefix_run, block_size: int):
        """Uploads a shared-prefix plan and plans `prefix_run`, the pass of each group's rows over its
        shared blocks. Returns the host indptr and device indices of the decode pass, over what
        each row reads besides; the caller releases the staging once it has planned that pass."""
        arrays = _PrefixPassArrays(
            query_indptr=shared.query_indptr,
            pages_indptr=shared.pages_indptr,
            pages=shared.pages,
            last_page_len=np.full(shared.num_groups, block_size, np.int32),
            order=shared.order,
            slots=shared.slots,
            suffix_indptr=shared.suffix_indptr,
            suffix_indices=shared.suffix_indices,
        )
        [device] = self._staging.upload(arrays)
        pinned = self._staging.pinned
        prefix_run.plan(
            pinned(device.query_indptr),
            pinned(device.pages_indptr),
            device.pages,
            pinned(device.last_page_len),
            *self._heads,
            block_size,
            causal=False,
            **self._kwargs,
        )
        self._prefix_run, self._slots, self._order = prefix_run, device.slots, device.order
        return pinned(device.suffix_indptr), device.suffix_indices

    def attend(self, layer: int, q: torch.Tensor, kv: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        # q: [T, heads, head_dim] -> [T, heads, head_dim]
        cache = kv.layers[layer]
        decodes = self._decodes  # their one token each comes first
        if decodes == len(q) and self._prefix_run is None:
            return self._decode_run.run(q, cache, out=out)
        out = torch.empty_like(q) if out is None else out
        if decodes == 0:
            return self._prefill.run(q, cache, out)
        if self._prefix_run is None:
            self._decode_run.run(q[:decodes], cache, out=out[:decodes])
        else:
            _, lse = self._decode_run.run(q[:decodes], cache, out=out[:decodes], return_lse=True)
            grouped = q.index_select(0, self._order)  # each group's rows together
            prefix_out, prefix_lse = self._prefix_run.run(grouped, cache, return_lse=True)
            merge_attention_states(out[:decodes], lse, prefix_out, prefix_lse, self._slots)
        if decodes < len(q):
            self._prefill.run(q[decodes:], cache, out[decodes:])
        return out


def _padded_to_max_groups(shared: SharedPrefixes) -> SharedPrefixes:
    """The plan with empty groups appended (no rows, one block already listed) up to MAX_GROUPS, the
    requests a graph's prefix pass was captured with."""
    missing = MAX_GROUPS - shared.num_groups
    return replace(
        shared,
        query_indptr=np.r_[shared.query_indptr, np.repeat(shared.query_indptr[-1:], missing)].astype(np.int32),
        pages_indptr=np.r_[shared.pages_indptr, shared.pages_indptr[-1] + np.arange(1, missing + 1)].astype(np.int32),
        pages=np.r_[shared.pages, np.repeat(shared.pages[:1], missing)].astype(np.int32),
    )
