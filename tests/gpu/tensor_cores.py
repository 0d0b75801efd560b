"""Triton's interpreter with a `tl.dot` as blind to a row's place in its tile as the GPU's tensor
cores, for the determinism tests on the CPU.

The interpreter multiplies a tile with numpy's BLAS, whose result for a row depends on the row's
place in the tile (OpenBLAS sums rows in different kernels by their index), so a token alone (row
0) and the same token in a prompt (row 17) differ there where they do not on a GPU: a tensor core
computes every element of its tile the same way. Summing each element's products in one loop over
K, in order, in float32, gives the interpreter that property and leaves every other part of the
kernels as they run. On CUDA the fixture changes nothing.
"""

import numpy as np
import pytest

from tests.devices import INTERPRETED


def _row_blind_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    from triton.runtime.interpreter import TensorHandle

    products = a.data.astype(np.float32)[:, :, None] * b.data.astype(np.float32)[None, :, :]  # [M, K, N]
    return TensorHandle(products.sum(axis=1, dtype=np.float32) + d.data, d.dtype.scalar)


@pytest.fixture
def row_blind_dot(monkeypatch):
    if INTERPRETED:
        from triton.runtime.interpreter import InterpreterBuilder

        monkeypatch.setattr(InterpreterBuilder, "create_dot", _row_blind_dot)
