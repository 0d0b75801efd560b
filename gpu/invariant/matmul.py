"""Matrix products whose every output row is the same bits whatever else shares the call: the
linear layers (qkv, o, gate_up, down, lm_head) under `--deterministic`.

cuBLAS picks a kernel, a tile and a split of K by the call's shape, and our batch-1 GEMV
(gpu/gemv.py) sums a row in another order than any tiled product, so by default a token's product
differs in its last bits between a decode of one and a prompt chunk of 4,096. Here every product
with one weight sums each output element over K in the same BLOCK_K steps (`block_k_for`, from the
weight's shape alone, never from the number of rows), in order, by tensor-core instructions into
one float32 accumulator, with no split of K. The tile around those steps (rows and columns per
program, warps, pipeline stages) does change with the row count (`config_for`): a one-row decode
wants narrow tiles over many programs to stream the weight, a prompt chunk wide ones to keep the
tensor cores busy. The tile does not change the bits: on an H200, each of 5 products of
llama-3.1-8b's shape gave the same bits for every row under each of 14 to 59 tiles with one K step
(tiles of 64 or 128 rows, 32 to 256 columns, 4 or 8 warps, 2 to 5 stages), and
tests/gpu/test_invariant_kernels.py checks rows alone against rows among thousands on the GPU.
Rows past the call's end are loaded as zeros and never stored; a row's products do not read the
other rows. The kernels are compiled once per tile, not per row count (`rows` is not specialized),
so CUDA graphs capture them at any batch size.

Two kernels walk the same steps. Small decode batches load their tiles through pointers, one
program per tile. Larger calls on a Hopper GPU load them with the tensor memory accelerator (TMA),
one program per multiprocessor looping over tiles, which keeps the tensor cores fed where the
pointer kernel does not: on an H200 a llama-3.1-8b step's products at 256 rows took 6.7 ms against
cuBLAS's 6.3 (the pointer kernel 9.1), at 4,096 rows 83 ms against 85 (116), each row the pointer
kernel's bits.
"""

from functools import cache
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# A one-row call (a batch-1 decode) runs one program per BLOCK_N columns of the weight. It streams
# the weight near the copy rate only if that spreads the weight over most of the GPU: a tile is
# made narrower until the call gets at least this many programs (132 multiprocessors on an H100).
MIN_ONE_ROW_PROGRAMS = 96
# Up to DECODE_ROWS a call is a small decode batch (memory-bound: narrow tiles); up to BATCH_ROWS a
# large decode batch (medium tiles); past it a prefill (compute-bound: wide tiles). Measured on an
# H200 with ops.bench.invariant_matmul's sweep.
DECODE_ROWS = 64
BATCH_ROWS = 512


class MatmulConfig(NamedTuple):
    block_m: int  # rows of the call per program
    block_n: int  # columns of the weight (output features) per program
    block_k: int  # the reduction's step: fixed per weight, the order every element is summed in
    group_m: int  # programs of neighbouring rows that share a weight tile in L2
    num_warps: int
    num_stages: int
    tma: bool = False  # TMA loads, one program per multiprocessor (else pointer loads, one per tile)
    warp_specialize: bool = False  # (TMA only) some warps issue the loads while the others multiply


@cache
def block_k_for(n_cols: int, k_cols: int, dtype: torch.dtype) -> int:
    """The K step of every product with an [n_cols, k_cols] weight: what fixes its bits. A weight
    whose one-row tiles are narrow (under 128 columns) takes steps of 128, so that a one-row call
    keeps enough weight bytes in flight; wide ones take 64 (faster for those by the sweep). float32
    takes half the step: the same bytes."""
    narrow = _decode_block_n(n_cols) < 128
    return (128 if narrow else 64) // (2 if dtype == torch.float32 else 1)


def config_for(n_cols: int, k_cols: int, dtype: torch.dtype, rows: int) -> MatmulConfig:
    """The tile of a product of `rows` rows with an [n_cols, k_cols] weight of `dtype`; its K step
    is the weight's whatever `rows` is. Small decode batches take 64-row tiles in 4 warps, as wide
    as MIN_ONE_ROW_PROGRAMS programs allow, with 5 stages in flight. Larger calls take TMA tiles
    where the GPU and the shapes allow them (`_tma_fits`), else the pointer kernel's: 128 x 128 in
    8 warps (128 x 256 where the K step is 64), 64 x 128 for large decode batches where it is 128."""
    regime = "decode" if rows <= DECODE_ROWS else "batch" if rows <= BATCH_ROWS else "prefill"
    return _config(n_cols, k_cols, dtype, regime)


@cache
def _config(n_cols: int, k_cols: int, dtype: torch.dtype, regime: str) -> MatmulConfig:
    """Measured on an H200 (a sweep of tiles, stages and warp specialization). TMA's large decode
    batches take 64 x 128 tiles in one warp group where the K step is long (o and down), with their
    loads warp-specialized; the pointer kernel's take them in two."""
    block_k = block_k_for(n_cols, k_cols, dtype)
    long_steps = block_k * dtype.itemsize >= 256
    tma = regime != "decode" and _tma_fits(n_cols, k_cols, dtype)
    if regime == "decode":
        block_m, block_n, warps, most_stages = 64, _decode_block_n(n_cols), 4, 5
    elif regime == "batch" and long_steps:
        block_m, block_n, warps, most_stages = 64, 128, 4 if tma else 8, 4
    else:
        block_m, block_n, warps, most_stages = 128, 128 if long_steps else 256, 8, 3
    stage_bytes = (block_m + block_n) * block_k * dtype.itemsize
    epilogue_bytes = block_m * block_n * dtype.itemsize if tma else 0  # TMA stages the output tile there too
    stages = max(2, min(most_stages, (_shared_memory_bytes() - epilogue_bytes) // stage_bytes))
    return MatmulConfig(block_m, block_n, block_k, 8, warps, stages, tma, warp_specialize=tma and regime == "batch")


def _tma_fits(n_cols: int, k_cols: int, dtype: torch.dtype) -> bool:
    """TMA needs a Hopper GPU or later (the CPU's interpreter emulates it) and rows of x, the weight
    and y that start on 16-byte boundaries."""
    hopper = not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] >= 9
    return hopper and (k_cols * dtype.itemsize) % 16 == 0 and (n_cols * dtype.itemsize) % 16 == 0


def _decode_block_n(n_cols: int) -> int:
    return next((n for n in (128, 64) if triton.cdiv(n_cols, n) >= MIN_ONE_ROW_PROGRAMS), 32)


@cache
def _shared_memory_bytes() -> int:
    """What one program may use (an H100's or H200's 227 KiB; an A100's 163 KiB); the CPU's
    interpreter has no limit, so a Hopper's is assumed for it."""
    if not torch.cuda.is_available():
        return 227 * 1024
    return torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin


@triton.jit
def _tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of the `tile`-th tile in program order. Tiles run down GROUP_M row
    tiles before the next columns, so a weight tile read from memory serves those row tiles from
    L2. Which program computes a tile changes no arithmetic."""
    per_group = GROUP_M * tiles_n
    first_m = tile // per_group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_rows, (tile % per_group) // group_rows


@triton.jit(do_not_specialize=["rows"])  # one compiled kernel for every row count
def _matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    rows,
    n_cols,
    k_cols,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # x: [rows, K] and y: [rows, N] contiguous; w: [N, K] contiguous (nn.Linear's layout).
    tile_m, tile_n = _tile_of(tl.program_id(0), tl.cdiv(rows, BLOCK_M), tl.cdiv(n_cols, BLOCK_N), GROUP_M)

    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_valid = offs_m < rows
    n_valid = offs_n < n_cols
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * k_cols
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * k_cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(0, k_cols, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        k_valid = cols < k_cols
        x = tl.load(x_rows + cols[None, :], mask=m_valid[:, None] & k_valid[None, :], other=0.0)  # [BM, BK]
        w = tl.load(w_rows + cols[None, :], mask=n_valid[:, None] & k_valid[None, :], other=0.0)  # [BN, BK]
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_valid, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + offs_m.to(tl.int64)[:, None] * n_cols + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_valid[:, None] & n_valid[None, :])


@triton.jit(do_not_specialize=["rows"])
def _tma_matmul_kernel(
    x_desc,
    w_desc,
    y_desc,
    bias_ptr,
    rows,
    n_cols,
    k_cols,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # The pointer kernel's tiles in the same order and its K steps, each program taking every
    # num_programs-th tile. TMA fills rows and columns past the ends with zeros and never stores
    # them. `flatten` lets the compiler start a tile's loads while the last one's products finish.
    tiles_m = tl.cdiv(rows, BLOCK_M)
    tiles_n = tl.cdiv(n_cols, BLOCK_N)
    for tile in tl.range(
        tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0), flatten=True, warp_specialize=WARP_SPECIALIZE
    ):
        tile_m, tile_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for start in range(0, k_cols, BLOCK_K):
            x = x_desc.load([tile_m * BLOCK_M, start])  # [BM, BK]
            w = w_desc.load([tile_n * BLOCK_N, start])  # [BN, BK]
            acc = tl.dot(x, w.T, acc, input_precision=DOT_PRECISION)
        if HAS_BIAS:
            offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < n_cols, other=0.0).to(tl.float32)[None, :]
        y_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(y_desc.dtype))


@cache
def _multiprocessors() -> int:
    """Programs of a TMA product: one per multiprocessor; the CPU's interpreter runs them in turn."""
    return (
        torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        if torch.cuda.is_available()
        else 2
    )


def matmul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: MatmulConfig | None = None
) -> torch.Tensor:
    """x @ weight.T + bias, each row's result independent of the others'. x: [T, K]; weight: [N, K]
    contiguous; bias: [N] -> [T, N] in x's dtype. `config` (benchmarks only) replaces the one
    `config_for` chooses; another K step than the weight's changes the bits of every result."""
    rows, k_cols = x.shape
    n_cols = weight.shape[0]
    if weight.shape[1] != k_cols or not weight.is_contiguous() or x.dtype != weight.dtype:
        raise ValueError(
            f"matmul needs x [T, K] and a contiguous weight [N, K] of one dtype, got {tuple(x.shape)} "
            f"{x.dtype} and {tuple(weight.shape)} {weight.dtype}"
        )
    y = torch.empty(rows, n_cols, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    config = config or config_for(n_cols, k_cols, weight.dtype, rows)
    x = x.contiguous()
    tiles = triton.cdiv(rows, config.block_m) * triton.cdiv(n_cols, config.block_n)
    common = dict(
        HAS_BIAS=bias is not None,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        # float32 stays float32: TF32 would cost it the precision it was chosen for.
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    bias = bias if bias is not None else weight
    if config.tma:
        if x.data_ptr() % 16:  # a view starting off a 16-byte boundary, which TMA cannot read
            x = x.clone()
        _tma_matmul_kernel[(min(tiles, _multiprocessors()),)](
            TensorDescriptor.from_tensor(x, [config.block_m, config.block_k]),
            TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k]),
            TensorDescriptor.from_tensor(y, [config.block_m, config.block_n]),
            bias,
            rows,
            n_cols,
            k_cols,
            WARP_SPECIALIZE=config.warp_specialize,
            **common,
        )
    else:
        _matmul_kernel[(tiles,)](x, weight, bias, y, rows, n_cols, k_cols, **common)
    return y
