"""The fused Triton kernels compute what the torch reference path computes.

They run on a CUDA GPU, or on the CPU under Triton's interpreter:
    TRITON_INTERPRET=1 python -m pytest tests/gpu/test_kernels.py
"""

import pytest
import torch
import torch.nn.functional as F

from gpu.config import RopeConfig
from gpu.kv_cache import KVCache
from gpu.layers import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq
from tests.devices import DEVICE, INTERPRETED, needs_triton

pytestmark = [
    pytest.mark.gpu,
    needs_triton,
]
DTYPE = torch.bfloat16
# The interpreter rounds float32 to bf16 toward zero (the GPU rounds to nearest), so results that
# are bit-exact on the GPU are only close there.
TOLERANCE = 3e-2 if INTERPRETED else 1e-2


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("hidden", [64, 200])
def test_add_rms_norm(with_residual, hidden):
    from gpu.kernels import add_rms_norm

    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(5, hidden, generator=gen).to(DTYPE).to(DEVICE)
    residual = torch.randn(5, hidden, generator=gen).to(DTYPE).to(DEVICE) if with_residual else None
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(DTYPE).to(DEVICE)
    expected_residual = x + residual if with_residual else x
    expected = rms_norm(expected_residual, weight, 1e-5)
    out, new_residual = add_rms_norm(x, residual.clone() if with_residual else None, weight, 1e-5)
    if INTERPRETED:
        assert relative_error(new_residual, expected_residual) < TOLERANCE
    else:
        assert torch.equal(new_residual, expected_residual)  # the residual stream rounds as transformers' does
    assert relative_error(out, expected) < TOLERANCE


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("head_dim", [16, 128])
def test_rope_store_kv(qk_norm, head_dim):
    from gpu.kernels import rope_store_kv

    heads, kv_heads, block_size, tokens = 4, 2, 4, 6
    gen = torch.Generator().manual_seed(head_dim)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(DTYPE).to(DEVICE)
    positions = torch.tensor([0, 1, 7, 300, 5, 4095], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([3, 8, 9, 14, 0, 21], dtype=torch.int32, device=DEVICE)
    inv_freq = rope_inv_freq(head_dim, RopeConfig(10000.0)).to(DEVICE)
    q_norm = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(DTYPE).to(DEVICE) if qk_norm else None
    k_norm = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(DTYPE).to(DEVICE) if qk_norm else None

    ours = KVCache(1, 6, block_size, kv_heads, head_dim, DTYPE, DEVICE)
    ours.layers[0].fill_(float("nan"))  # every slot the kernel should not write stays NaN
    q = rope_store_kv(qkv, positions, inv_freq, ours.layers[0], slots, heads, kv_heads, head_dim, q_norm, k_norm, 1e-6)

    ref = KVCache(1, 6, block_size, kv_heads, head_dim, DTYPE, DEVICE)
    q_ref, k_ref, v_ref = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q_ref, k_ref = q_ref.view(tokens, heads, head_dim), k_ref.view(tokens, kv_heads, head_dim)
    if qk_norm:
        q_ref, k_ref = rms_norm(q_ref, q_norm, 1e-6), rms_norm(k_ref, k_norm, 1e-6)
    cos, sin = rope_cos_sin(positions, inv_freq, DTYPE)
    q_ref, k_ref = apply_rope(q_ref, cos, sin), apply_rope(k_ref, cos, sin)
    ref.write(0, k_ref, v_ref.reshape(tokens, kv_heads, head_dim), slots)

    assert q.shape == (tokens, heads, head_dim)
    assert relative_error(q, q_ref) < TOLERANCE
    flat_ours = ours.layers[0].view(-1, kv_heads, head_dim)
    flat_ref = ref.layers[0].view(-1, kv_heads, head_dim)
    k_rows = slots.long() + (slots.long() // block_size) * block_size
    for rows in (k_rows, k_rows + block_size):
        assert relative_error(flat_ours[rows], flat_ref[rows]) < TOLERANCE
    written = torch.zeros(flat_ours.shape[0], dtype=torch.bool, device=DEVICE)
    written[k_rows], written[k_rows + block_size] = True, True
    assert flat_ours[~written].isnan().all()


def test_silu_and_mul():
    from gpu.kernels import silu_and_mul

    gate_up = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(0)).to(DTYPE).to(DEVICE)
    gate, up = gate_up.chunk(2, dim=-1)
    assert relative_error(silu_and_mul(gate_up), F.silu(gate) * up) < TOLERANCE


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fused_forward_matches_the_torch_path(arch, build_tiny_model, monkeypatch):
    """The whole model with the kernels against the same model on the torch path, prefill then decode."""
    import gpu.model
    from gpu.forward_batch import ForwardBatch
    from gpu.runner import ModelRunner
    from tests.gpu.decoding import random_prompt, shuffled_tables

    runner = ModelRunner(
        build_tiny_model(arch),
        device=DEVICE,
        dtype="bfloat16",
        num_kv_blocks=64,
        block_size=16,
        attention_backend="torch",
        cuda_graphs=False,
    )
    prompts = [random_prompt(n, seed=n) for n in (7, 20)]
    tables = shuffled_tables([40, 40], seed=1)
    logits = {}
    for fused in (False, True):
        monkeypatch.setattr(gpu.model, "_uses_kernels", lambda x, fused=fused: fused)
        with torch.inference_mode():
            prefill = runner.model(ForwardBatch.build(prompts, [0, 0], tables, 16, DEVICE), runner.kv)
            decode = runner.model(ForwardBatch.build([[11], [12]], [7, 20], tables, 16, DEVICE), runner.kv)
        logits[fused] = torch.cat([prefill, decode])
    assert relative_error(logits[True], logits[False]) < 2 * TOLERANCE


# Shapes off the kernel's blocks: rows not a multiple of the rows per program, K not a power of two,
# and K above one block (the loop).
@pytest.mark.parametrize("rows, cols", [(7, 96), (33, 2500)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_linear(rows, cols, with_bias):
    from gpu.gemv import gemv

    gen = torch.Generator().manual_seed(rows + cols)
    x = torch.randn(1, cols, generator=gen)
    weight = torch.randn(rows, cols, generator=gen) / cols**0.5
    bias = torch.randn(rows, generator=gen) if with_bias else None
    expected = F.linear(x.to(DTYPE).double(), weight.to(DTYPE).double(), bias.to(DTYPE).double() if with_bias else None)
    out = gemv(x.to(DTYPE).to(DEVICE), weight.to(DTYPE).to(DEVICE), bias.to(DTYPE).to(DEVICE) if with_bias else None)
    assert out.shape == (1, rows) and out.dtype == DTYPE
    assert relative_error(out.cpu(), expected) < TOLERANCE


def test_silu_mul_gemv_matches_the_unfused_product():
    from gpu.gemv import gemv

    inner, hidden = 320, 48
    gen = torch.Generator().manual_seed(5)
    gate_up = torch.randn(1, 2 * inner, generator=gen).to(DTYPE)
    weight = (torch.randn(hidden, inner, generator=gen) / inner**0.5).to(DTYPE)
    gate, up = gate_up.float().chunk(2, dim=-1)
    activated = (F.silu(gate).to(DTYPE).float() * up).to(DTYPE)  # rounded as transformers' bf16 MLP rounds
    expected = F.linear(activated.double(), weight.double())
    out = gemv(gate_up.to(DEVICE), weight.to(DEVICE), silu_mul=True)
    assert relative_error(out.cpu(), expected) < TOLERANCE


def test_gemv_refuses_more_than_one_row():
    from gpu.gemv import gemv

    with pytest.raises(ValueError, match="one row"):
        gemv(torch.ones(2, 8, dtype=DTYPE, device=DEVICE), torch.ones(4, 8, dtype=DTYPE, device=DEVICE))
