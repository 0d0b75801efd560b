"""The project's own attention backend: the Triton kernels of triton_kernels.py over the paged cache.

FlashInfer is faster where it fits; this one runs wherever Triton does (any CUDA GPU, float32 and
any head size included), so `auto` falls back to it on CUDA. Plans are made from the batch's
device metadata, sized by its host copies, so `prepare` never waits on the GPU. CUDA-graph decode
reads its metadata from buffers of fixed address that `prepare_graph` fills.
"""

from dataclasses import dataclass

import torch

from gpu.attention.base import PLAIN_GRAPH, AttentionBackend, BackendInputs, Paged
from gpu.attention.graph_buffers import GraphDecodeBuffers
from gpu.attention.triton_kernels import decode_attention, extend_attention, extend_tiles
from gpu.attention.triton_launch import ExtendTiles, check_triton_runs, multiprocessors, programs_to_fill
from gpu.forward_batch import ForwardBatch
from gpu.kv_cache import KVCache


@dataclass(frozen=True)
class _Plan:
    paged: Paged
    num_splits: int = 1  # decode: programs per (sequence, KV head)
    query_start: torch.Tensor | None = None  # [S+1] int32; extend only
    tiles: ExtendTiles | None = None  # extend only; None: a decode step


class TritonAttention(AttentionBackend):
    supports_cuda_graphs = True

    def __init__(self, inputs: BackendInputs, decode_splits: int | None = None) -> None:
        """`decode_splits`: programs per sequence and KV head in decode steps; None picks them from
        the batch size and the GPU's multiprocessor count (1 on the CPU)."""
        check_triton_runs(inputs, "Triton attention")
        if decode_splits is not None and decode_splits < 1:
            raise ValueError(f"decode_splits must be positive, got {decode_splits}")
        self.scale = inputs.scale
        self._num_kv_heads = inputs.num_kv_heads
        # what an extend step's tiles depend on
        self._tile_shape = (inputs.num_heads // inputs.num_kv_heads, inputs.head_dim, inputs.dtype)
        self._decode_splits = decode_splits
        self._multiprocessors = multiprocessors(inputs.device)
        self._graph = GraphDecodeBuffers(inputs.max_graph_batch, inputs.max_pages_per_seq, inputs.device)
        self._plan: _Plan | None = None

    def prepare(self, batch: ForwardBatch) -> None:
        paged = Paged(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len)
        if batch.host.is_decode:
            self._plan = _Plan(paged, num_splits=self._splits(batch.num_seqs))
        else:
            tiles = extend_tiles(batch.query_start, batch.host.query_lens, *self._tile_shape)
            self._plan = _Plan(paged, query_start=batch.query_start, tiles=tiles)

    def prepare_graph(self, batch: ForwardBatch, kind: str | None = None) -> str:
        # The split count depends on the size alone, so a replay launches what was captured.
        self._plan = _Plan(self._graph.fill(batch), num_splits=self._splits(batch.num_seqs))
        return PLAIN_GRAPH

    def attend(self, layer: int, q: torch.Tensor, kv: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        plan, cache = self._plan, kv.layers[layer]  # cache: [num_blocks + 1, 2, block_size, kv_heads, head_dim]
        if plan.tiles is None:
            return decode_attention(q, cache, plan.paged, self.scale, plan.num_splits, out)  # [S, heads, head_dim]
        return extend_attention(
            q, cache, plan.paged, plan.query_start, plan.tiles, self.scale, out
        )  # [T, heads, head_dim]

    def _splits(self, num_seqs: int) -> int:
        if self._decode_splits is not None:
            return self._decode_splits
        return programs_to_fill(self._multiprocessors, num_seqs, self._num_kv_heads)
