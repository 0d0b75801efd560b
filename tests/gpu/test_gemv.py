"""Our matrix-vector kernel computes what F.linear computes, on a CUDA GPU or, on the CPU, under
Triton's interpreter (TRITON_INTERPRET=1, which tests/conftest.py sets when there is no CUDA)."""

import os

import pytest
import torch
import torch.nn.functional as F

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="needs a CUDA GPU or TRITON_INTERPRET=1"),
]
DTYPE = torch.bfloat16
# The interpreter rounds float32 to bf16 toward zero (the GPU rounds to nearest): the activation's
# roundings are off by more there.
TOLERANCE = 3e-2 if INTERPRETED else 1e-2


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


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
