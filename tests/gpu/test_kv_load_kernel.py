"""The kernel that loads one layer of blocks from host slots into the pool (gpu/kv_load_kernel.py)
writes what torch's index ops write, and nothing else. On a CUDA GPU, or on the CPU under Triton's
interpreter:
    TRITON_INTERPRET=1 python -m pytest tests/gpu/test_kv_load_kernel.py
"""

import pytest
import torch

from gpu.kv_load_kernel import BLOCK_WORDS, load_layer, load_layer_torch
from tests.devices import DEVICE, needs_triton

pytestmark = [pytest.mark.gpu, needs_triton]

LAYERS, BLOCKS = 3, 10
ROW_WORDS = 2 * BLOCK_WORDS + 500  # three spans a row, the last one short


@pytest.mark.parametrize("layer", range(LAYERS))
def test_one_layer_of_scattered_slots_lands_in_its_blocks(layer):
    generator = torch.Generator().manual_seed(layer)
    slot_words = LAYERS * ROW_WORDS + 16  # rows further apart than a slot's layers
    host = torch.randint(-(2**62), 2**62, (7, slot_words), generator=generator)[:, : LAYERS * ROW_WORDS]
    pool = torch.randint(-(2**62), 2**62, (LAYERS * (BLOCKS + 1), ROW_WORDS), generator=generator)
    slots, blocks = torch.tensor([5, 0, 3, 6], dtype=torch.int32), torch.tensor([9, 2, 10, 4], dtype=torch.int32)
    expected = pool.clone()
    load_layer_torch(host, expected, slots, blocks, layer, 4)
    assert not torch.equal(expected, pool)
    on = torch.device(DEVICE)
    # On a GPU the kernel reads device memory here; the host-mapped case is tests/gpu/test_kv_transfer.py's.
    out = pool.to(on)
    load_layer(host.to(on), out, slots.to(on), blocks.to(on), layer, 4)
    assert torch.equal(out.cpu(), expected)
