"""What the two Triton attention backends (triton_backend.py, gpu/invariant/attention.py) plan on
the host for their kernels, which are built of paged_tiles.py: the tiles of an extend step, the
arguments that say where the tiles' queries and keys are, whether the kernels run here at all, and
how many programs a small decode batch spreads each sequence over.
"""

import os
from typing import NamedTuple

import numpy as np
import torch
import triton

from gpu.attention.base import BackendInputs, Paged
from gpu.attention.paged_tiles import LOG2_E

MAX_PROGRAMS = 16  # per (sequence, KV head) in a decode
PROGRAMS_PER_SM = 2  # spread a decode's keys until the grid covers the GPU this many times over


class TileConfig(NamedTuple):
    block_m: int  # rows of a tile: tokens x query heads of one KV head
    block_n: int  # keys per step of the online softmax
    num_warps: int
    num_stages: int


class ExtendTiles(NamedTuple):
    """The query tiles of an extend step, one program each (per KV head)."""

    seq: torch.Tensor  # [tiles] int32, the sequence a tile belongs to
    index: torch.Tensor  # [tiles] int32, its place among that sequence's tiles
    tokens: int  # new tokens per tile, fixed by the tile shape


def query_tiles(query_start: torch.Tensor, host_query_lens: np.ndarray, tokens: int) -> ExtendTiles:
    """Each sequence's new tokens cut into tiles of `tokens`, computed on query_start's device; the
    host copy of the query lengths only sizes them, so nothing waits on the device."""
    total = int((-(-host_query_lens // tokens)).sum())
    tiles = (query_start[1:] - query_start[:-1] + tokens - 1) // tokens  # [S]
    seqs = torch.arange(len(tiles), dtype=torch.int32, device=query_start.device)
    seq = torch.repeat_interleave(seqs, tiles, output_size=total)  # [tiles]
    first_tile = torch.cumsum(tiles, 0, dtype=torch.int32) - tiles  # [S]
    index = torch.arange(total, dtype=torch.int32, device=query_start.device) - first_tile[seq]
    return ExtendTiles(seq, index, tokens)


def block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))  # the dot's minimum K


def tile_arguments(
    q: torch.Tensor,
    cache: torch.Tensor,
    paged: Paged,
    tiles: ExtendTiles | None,
    query_start: torch.Tensor | None,
    scale: float,
    config: TileConfig,
) -> dict:
    """By name, the arguments of a kernel built on load_query_tile and attend_key_range that say
    where its tiles' queries and keys are, and its launch options. q: [T, heads, head_dim]; cache:
    [blocks, 2, block_size, kv_heads, head_dim]; an extend step's `tiles` and `query_start` [S+1],
    None in a decode step."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    heads, head_dim, kv_heads = q.shape[1], q.shape[2], cache.shape[3]
    decode = tiles is None  # decode reads no tiles or query_start: any int32 pointer stands in
    return dict(
        q_ptr=q,
        cache_ptr=cache,
        query_start_ptr=paged.kv_indptr if decode else query_start,
        kv_indptr_ptr=paged.kv_indptr,
        kv_indices_ptr=paged.kv_indices,
        last_page_len_ptr=paged.last_page_len,
        tile_seq_ptr=paged.kv_indptr if decode else tiles.seq,
        tile_index_ptr=paged.kv_indptr if decode else tiles.index,
        qk_scale=scale * LOG2_E,
        block_size=cache.shape[2],
        q_token_stride=q.stride(0),
        q_head_stride=q.stride(1),
        page_stride=cache.stride(0),
        kv_stride=cache.stride(1),
        slot_stride=cache.stride(2),
        kv_head_stride=cache.stride(3),
        GROUP=heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d(head_dim),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        DECODE=decode,
        # float32 must stay float32: TF32 would cost it the precision it was chosen for.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def check_triton_runs(inputs: BackendInputs, backend: str) -> None:
    """Raises, naming `backend`, where its kernels cannot serve these heads on this device."""
    if inputs.num_heads % inputs.num_kv_heads:
        raise ValueError(f"{inputs.num_heads} attention heads do not split evenly over {inputs.num_kv_heads} KV heads")
    if inputs.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{backend} needs a CUDA device (or TRITON_INTERPRET=1 to interpret it on the CPU)")


def multiprocessors(device: torch.device) -> int:
    """The GPU's multiprocessor count; 0 on the CPU."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0


def programs_to_fill(multiprocessors: int, num_seqs: int, num_kv_heads: int) -> int:
    """Programs per (sequence, KV head) that cover the GPU with a decode of `num_seqs`: few sequences
    leave most multiprocessors idle unless each one's keys are spread over programs (1 on the CPU).
    Powers of two only: each count is a kernel compiled of its own."""
    wanted = -(-PROGRAMS_PER_SM * multiprocessors // (num_seqs * num_kv_heads))
    return min(MAX_PROGRAMS, triton.next_power_of_2(max(1, wanted)))
