"""The attention backend of `--deterministic`: attention_kernels.py over the paged cache, planned as
the `triton` backend plans (from the batch's device metadata, sized by its host copies, so `prepare`
never waits on the GPU; CUDA-graph decodes read fixed buffers that `prepare_graph` fills).

What the batch may choose is only where a token's splits are computed, never how: a decode step
whose sequences would leave most multiprocessors idle spreads each one's splits over programs and
folds them in a second kernel; every other step folds them where they are made. Both give a token
the same bits. A prefix shared by many decodes is read per sequence: FlashInfer's cascade
(shared_prefix.py) does not run in this mode.
"""

from dataclasses import dataclass

import torch
import triton

from gpu.attention.base import PLAIN_GRAPH, AttentionBackend, BackendInputs, Paged
from gpu.attention.graph_buffers import GraphDecodeBuffers
from gpu.attention.triton_launch import ExtendTiles, check_triton_runs, multiprocessors, programs_to_fill, query_tiles
from gpu.forward_batch import ForwardBatch
from gpu.invariant.attention_kernels import KV_SPLIT, attend, attention_config
from gpu.kv_cache import KVCache


@dataclass(frozen=True)
class _Plan:
    paged: Paged
    query_start: torch.Tensor | None = None  # [S+1] int32; extend only
    tiles: ExtendTiles | None = None  # extend only; None: a decode step
    split_programs: int = 0  # decode: programs per (sequence, KV head) its splits spread over; 0: none
    max_splits: int = 0  # decode with split programs: room for this many splits per token


class InvariantAttention(AttentionBackend):
    supports_cuda_graphs = True

    def __init__(self, inputs: BackendInputs, split_programs: int | None = None) -> None:
        """`split_programs`: programs per sequence and KV head a decode spreads its splits over (0:
        none); None picks them from the batch size and the GPU's multiprocessor count (none on the
        CPU). Either way a token's result is the same."""
        check_triton_runs(inputs, "deterministic attention")
        if split_programs is not None and split_programs < 0:
            raise ValueError(f"split_programs must be 0 or more, got {split_programs}")
        self.scale = inputs.scale
        self._num_kv_heads = inputs.num_kv_heads
        group = inputs.num_heads // inputs.num_kv_heads
        self._tile_tokens = attention_config(group, inputs.head_dim).block_m // group
        self._split_programs = split_programs
        self._multiprocessors = multiprocessors(inputs.device)
        # A graph's split decode is captured with room for the longest context a sequence may have.
        self._graph_max_splits = triton.cdiv(max(1, inputs.max_pages_per_seq * inputs.block_size), KV_SPLIT)
        self._graph = GraphDecodeBuffers(inputs.max_graph_batch, inputs.max_pages_per_seq, inputs.device)
        self._plan: _Plan | None = None

    def prepare(self, batch: ForwardBatch) -> None:
        paged = Paged(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len)
        host = batch.host
        if host.is_decode:
            longest = int(host.context_lens.max()) if host.num_seqs else 1
            self._plan = _Plan(
                paged, split_programs=self._programs(host.num_seqs), max_splits=triton.cdiv(longest, KV_SPLIT)
            )
        else:
            tiles = query_tiles(batch.query_start, host.query_lens, self._tile_tokens)
            self._plan = _Plan(paged, query_start=batch.query_start, tiles=tiles)

    def prepare_graph(self, batch: ForwardBatch, kind: str | None = None) -> str:
        # The programs depend on the size alone, so a replay launches what was captured.
        self._plan = _Plan(
            self._graph.fill(batch), split_programs=self._programs(batch.num_seqs), max_splits=self._graph_max_splits
        )
        return PLAIN_GRAPH

    def attend(self, layer: int, q: torch.Tensor, kv: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        plan = self._plan
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
        return attend(
            q,
            kv.layers[layer],  # [num_blocks + 1, 2, block_size, kv_heads, head_dim]
            plan.paged,
            self.scale,
            out,
            tiles=plan.tiles,
            query_start=plan.query_start,
            split_programs=plan.split_programs,
            max_splits=plan.max_splits,
        )  # [T, heads, head_dim]

    def _programs(self, num_seqs: int) -> int:
        if self._split_programs is not None:
            return self._split_programs
        programs = programs_to_fill(self._multiprocessors, num_seqs, self._num_kv_heads)
        return 0 if programs == 1 else programs  # one program folds its splits where it makes them
