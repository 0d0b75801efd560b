"""Batch-invariant operators: what `--deterministic` computes with, so that a token's numbers are
the same bits whatever shares its steps (its batch, its prompt's chunking, a cached prefix, a
preemption or a restart that recomputes it).

- matmul.py: every linear layer, one tile configuration per weight for any number of rows;
- attention_kernels.py, attention.py: attention reducing each token's keys in fixed splits at
  absolute positions, folded in order, for prefill, chunks and decode alike;
- the residual RMSNorm is gpu/kernels.py's fused kernel, already one program per row reducing the
  whole row in one block, now taken on every dtype on CUDA (torch's float32 reduction splits a row
  by the tensor's shape); rotary, the KV write and the activation are elementwise.
What the model computes after the logits was batch-invariant already: the sampler (gpu/sampler_kernel.py
folds a row's blocks in one order, split or not), the logprobs (gpu/logprob_kernel.py: blocks of
a fixed size, folded in order, per row), the token rules and masks (elementwise per row).

These run where Triton does: on CUDA, or on the CPU under TRITON_INTERPRET=1 (tests). On the CPU
otherwise the default operators are already row-invariant (gpu/gemv.py:linear computes a row at a
time; the torch attention a token at a time).
"""

import os

import torch

from gpu.invariant.matmul import matmul
from gpu.layers import RMSNorm
from gpu.model import Operators


def runs_here(device: torch.device) -> bool:
    """Whether the invariant kernels run on `device`: CUDA, or any device under Triton's interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _silu_mul_down(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    from gpu.kernels import silu_and_mul  # elementwise, per row

    return matmul(silu_and_mul(gate_up), weight, bias)


def _add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
    from gpu.kernels import add_rms_norm

    return add_rms_norm(x, residual, norm.weight, norm.eps)


INVARIANT_OPERATORS = Operators(linear=matmul, silu_mul_down=_silu_mul_down, add_rms_norm=_add_rms_norm)
