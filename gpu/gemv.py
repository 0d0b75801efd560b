"""Matrix-vector products for batch-1 decode: the products that stream every weight once per token.

With one token a layer's products are pure weight reads, which this kernel does nearer the copy
rate than cuBLAS (docs/journal/benchmarks.md, section "Batch-1 decode through our own GEMV").
`linear` takes this path for a single row on the GPU in bf16/fp16 and leaves everything else to
`F.linear` (on the CPU over whole blocks of rows, so a row's product is the same in any batch).
`silu_mul_linear` also folds SwiGLU's activation into the down projection's reads, saving a kernel
per layer. TRITON_INTERPRET=1 runs the kernel on the CPU for tests.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

_GEMV_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    n_rows,
    k_cols,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # One program per BLOCK_N output rows; it streams those weight rows whole, accumulating in float32.
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * k_cols
    dtype = y_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for start in range(0, k_cols, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_mask = cols < k_cols
        x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if SILU_MUL:  # x holds gate | up; round where the unfused silu_and_mul kernel rounds
            up = tl.load(x_ptr + k_cols + cols, mask=col_mask, other=0.0).to(tl.float32)
            x = ((x / (1.0 + tl.exp(-x))).to(dtype).to(tl.float32) * up).to(dtype).to(tl.float32)
        # The weights are read once per step: keep them from evicting what the next kernel reuses.
        w = tl.load(
            w_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0, eviction_policy="evict_first"
        )
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)  # [BLOCK_N]
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, y.to(dtype), mask=row_mask)


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, silu_mul: bool = False
) -> torch.Tensor:
    """x @ weight.T + bias for one row. x: [1, K] (with silu_mul: [1, 2K], gate | up, multiplied
    as silu(gate) * up first); weight: [N, K] contiguous; bias: [N] -> [1, N]"""
    n_rows, k_cols = weight.shape
    if not weight.is_contiguous() or x.shape[0] != 1 or x.shape[1] != k_cols * (2 if silu_mul else 1):
        raise ValueError(
            f"gemv needs one row of {k_cols * (2 if silu_mul else 1)} and a contiguous [N, K] "
            f"weight, got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    y = torch.empty(1, n_rows, dtype=x.dtype, device=x.device)
    launch_gemv(x.contiguous(), weight, bias, y, silu_mul, *gemv_config(n_rows, k_cols))
    return y


def gemv_config(n_rows: int, k_cols: int) -> tuple[int, int, int, int]:
    """(rows per program, columns per load, warps, pipeline stages) for an [n_rows, k_cols] weight.
    From a sweep on llama-3.1-8b (docs/journal/benchmarks.md, section "Batch-1 decode through our
    own GEMV"): loads of 2048 columns won on every product; two rows per program, eight on long rows
    (the down projection); the number of pipeline stages made no difference."""
    block_k = min(2048, triton.next_power_of_2(k_cols))
    return (8 if k_cols >= 8192 else 2), block_k, (8 if block_k >= 512 else 4), 3


def launch_gemv(
    x, weight, bias, y, silu_mul: bool, block_n: int, block_k: int, num_warps: int, num_stages: int
) -> None:
    """Runs the kernel with a given configuration into y [1, N]; `gemv` is the checked entry point."""
    n_rows, k_cols = weight.shape
    _gemv_kernel[(triton.cdiv(n_rows, block_n),)](
        x,
        weight,
        bias if bias is not None else weight,
        y,
        n_rows,
        k_cols,
        HAS_BIAS=bias is not None,
        SILU_MUL=silu_mul,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def _takes_gemv(x: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype in _GEMV_DTYPES and x.shape[0] == 1


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through `gemv` for a single row on the GPU, and a row at a time on the CPU.
    x: [T, K], weight: [N, K] -> [T, N]"""
    if _takes_gemv(x):
        return gemv(x, weight, bias)
    if x.is_cuda or x.shape[0] == 1:
        return F.linear(x, weight, bias)
    # A CPU BLAS blocks the rows of a product by the call's shape (MKL sums a last partial block of
    # rows in another order, and how it blocks differs between CPUs), so a token's product would
    # depend on how many rows shared the call. One row at a time, a token's numbers are those of a
    # decode wherever it sits: the logprobs a rollout returned equal, exactly, those of the sequence
    # fed back as a prompt, on any CPU.
    return torch.cat([F.linear(row, weight, bias) for row in x.split(1)])


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(silu(gate) * up, weight, bias) with SwiGLU's activation fused on the GPU path (bf16/fp16).
    gate_up: [T, 2 * inner], weight: [hidden, inner] -> [T, hidden]"""
    if _takes_gemv(gate_up):
        return gemv(gate_up, weight, bias, silu_mul=True)
    from gpu.kernels import silu_and_mul

    return F.linear(silu_and_mul(gate_up), weight, bias)
