"""Triton kernels that fuse the decoder's small elementwise steps on the GPU path (bf16/fp16).

At batch 1 a layer's matrix products take tens of microseconds while each small torch kernel
(norm, rotary, activation, KV write) costs a few: unfused, they would add milliseconds per step.
Each kernel rounds to the model dtype where transformers' bf16 arithmetic rounds, so the fused path
stays as close to the reference as the unfused one. The float32 and CPU paths keep the torch code
in `gpu/layers.py`. TRITON_INTERPRET=1 runs these on the CPU for tests.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    x_stride,
    residual_stride,
    out_stride,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per row, reducing the whole row in one block: a row's bits never depend on the
    # batch, which `--deterministic` relies on (tests/gpu/test_invariant_kernels.py).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # the residual stream's rounding
        tl.store(residual_ptr + row * residual_stride + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x32 * x32, axis=0) / n_cols + eps)
    normed = (x32 * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (in place), then RMSNorm of it; with no residual, x itself is normed and becomes
    the residual. x, residual: [T, hidden] -> (normed [T, hidden], residual)"""
    out = torch.empty_like(x)
    rows, cols = x.shape
    if rows:
        _add_rms_norm_kernel[(rows,)](
            x,
            residual if residual is not None else x,
            weight,
            out,
            x.stride(0),
            residual.stride(0) if residual is not None else 0,
            out.stride(0),
            cols,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=triton.next_power_of_2(cols),
            num_warps=_warps(cols),
        )
    return out, residual if residual is not None else x


@triton.jit
def _rope_store_kv_kernel(
    qkv_ptr,
    positions_ptr,
    inv_freq_ptr,
    q_out_ptr,
    cache_ptr,
    slots_ptr,
    q_norm_ptr,
    k_norm_ptr,
    qkv_stride,
    num_heads,
    num_kv_heads,
    block_size,
    eps,
    HEAD_DIM: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
    HAS_QK_NORM: tl.constexpr,
):
    # One program per (token, q or k head); a k program also copies the matching v head.
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    half: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF_BLOCK)
    mask = offs < half
    dtype = q_out_ptr.dtype.element_ty
    src = qkv_ptr + token * qkv_stride + head * HEAD_DIM  # q heads, then k heads, then v heads
    x1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_QK_NORM:  # Qwen3: RMSNorm of each head before the rotation
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HEAD_DIM + eps)
        if head < num_heads:
            w1 = tl.load(q_norm_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            w2 = tl.load(q_norm_ptr + half + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            w1 = tl.load(k_norm_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            w2 = tl.load(k_norm_ptr + half + offs, mask=mask, other=0.0).to(tl.float32)
        x1 = ((x1 * inv_rms).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * inv_rms).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    angle = tl.load(positions_ptr + token).to(tl.float32) * tl.load(inv_freq_ptr + offs, mask=mask, other=0.0)
    cos = tl.cos(angle).to(dtype).to(tl.float32)  # transformers rounds cos/sin to the model dtype
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    out1 = (x1 * cos - x2 * sin).to(dtype)
    out2 = (x2 * cos + x1 * sin).to(dtype)
    if head < num_heads:
        dst = q_out_ptr + (token * num_heads + head) * HEAD_DIM
        tl.store(dst + offs, out1, mask=mask)
        tl.store(dst + half + offs, out2, mask=mask)
    else:
        kv_head = head - num_heads
        slot = tl.load(slots_ptr + token).to(tl.int64)
        block = slot // block_size
        # cache layer: [blocks, 2 (K, V), block_size, kv_heads, head_dim]
        k_dst = cache_ptr + ((block * 2 * block_size + slot % block_size) * num_kv_heads + kv_head) * HEAD_DIM
        tl.store(k_dst + offs, out1, mask=mask)
        tl.store(k_dst + half + offs, out2, mask=mask)
        v_src = src + num_kv_heads * HEAD_DIM
        v_dst = k_dst + block_size * num_kv_heads * HEAD_DIM
        tl.store(v_dst + offs, tl.load(v_src + offs, mask=mask, other=0.0), mask=mask)
        tl.store(v_dst + half + offs, tl.load(v_src + half + offs, mask=mask, other=0.0), mask=mask)


def rope_store_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    cache_layer: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Rotates q and k (after Qwen3's per-head norm), writes k and v to their KV slots, returns q.

    qkv: [T, (heads + 2 kv_heads) * head_dim] rows of q | k | v; positions, slot_mapping: [T];
    inv_freq: [head_dim / 2] float32; cache_layer: [blocks, 2, block_size, kv_heads, head_dim]
    -> q: [T, heads, head_dim]
    """
    tokens = qkv.shape[0]
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens:
        has_norm = q_norm is not None
        _rope_store_kv_kernel[(tokens, num_heads + num_kv_heads)](
            qkv,
            positions,
            inv_freq,
            q,
            cache_layer,
            slot_mapping,
            q_norm if has_norm else qkv,
            k_norm if has_norm else qkv,
            qkv.stride(0),
            num_heads,
            num_kv_heads,
            cache_layer.shape[2],
            eps,
            HEAD_DIM=head_dim,
            HALF_BLOCK=triton.next_power_of_2(head_dim // 2),
            HAS_QK_NORM=has_norm,
            num_warps=1,
        )
    return q


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (activated * up).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's middle: silu(gate) * up. gate_up: [T, 2 * inner] -> [T, inner]"""
    rows, cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, cols, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = 1024
        _silu_and_mul_kernel[(rows, triton.cdiv(cols, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), cols, BLOCK=block, num_warps=4
        )
    return out


def _warps(cols: int) -> int:
    return 8 if cols >= 4096 else 4 if cols >= 1024 else 1
