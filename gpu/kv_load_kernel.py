"""One layer of KV blocks loaded from the host tier's slots into the pool by the GPU's own threads,
which read the page-locked slots across PCIe (gpu/kv_transfer.py loads a block set layer by layer
this way, so a step attends over layer i while later layers still cross).

A slot keeps a block's layers together ([num_layers, 2, block_size, kv_heads, head_dim]), so one
layer of a block is a short span of it (64 KiB of llama-3.1-8b's 2 MiB). A copy engine moves such
spans one copy at a time and crawls; the SMs read them at the link's rate, about as fast as the
copy engine moves whole 2 MiB slots (measured: docs/journal/2026-11-26-layered-loads.md).
"""

import torch
import triton
import triton.language as tl

# Words (8 bytes) a program copies at a time: one layer's block of llama-3.1-8b (64 KiB), so that a
# few programs keep enough reads in flight to fill the link.
BLOCK_WORDS = 8192
# The share of the SMs a load takes: one SM in 16 (8 programs of an H200's 132). Its programs stay
# resident for a whole layer, waiting on PCIe, and slow the step's kernels that the load is meant
# to run beside. Eight keep enough reads in flight to fill the link (48 GB/s, as 33 did); with 33,
# a 16-token step over an 8K prefix from the host ended about 4.5 ms after the load, with 8 about
# 1 ms after (docs/journal/2026-11-27-host-hit-timeline.md).
SM_SHARE = 16


@triton.jit(do_not_specialize=["count", "layer"])  # one compiled kernel for every load
def _load_layer_kernel(
    host_ptr,  # int64 words of the slots, mapped into the device's address space
    pool_ptr,  # int64 words of the pool's rows (gpu/kv_cache.py: KVCache.rows)
    slots_ptr,
    blocks_ptr,  # the pool block each slot's layer goes to
    count,
    layer,
    slot_words,  # words between one slot and the next
    row_words,  # one layer's block: words of a pool row
    layer_rows,  # pool rows a layer has (its blocks and the scratch block)
    BLOCK: tl.constexpr,
):
    parts = tl.cdiv(row_words, BLOCK)
    for work in range(tl.program_id(0), count * parts, tl.num_programs(0)):
        i = work // parts
        offs = (work % parts) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < row_words
        slot = tl.load(slots_ptr + i).to(tl.int64)
        row = layer * layer_rows + tl.load(blocks_ptr + i).to(tl.int64)
        words = tl.load(host_ptr + slot * slot_words + layer * row_words + offs, mask=mask)
        tl.store(pool_ptr + row * row_words + offs, words, mask=mask)


def load_layer(
    host_words: torch.Tensor,
    pool_words: torch.Tensor,
    slots: torch.Tensor,
    blocks: torch.Tensor,
    layer: int,
    count: int,
):
    """Layer `layer` of pool block blocks[i] <- that layer of host slot slots[i], for i < `count`, on
    the current stream.

    host_words: int64 [num_slots, slot_words] the device can read (`mapped_on_device`), its rows
    contiguous; pool_words: the pool's rows as int64 [num_layers * layer_rows, row_words]
    (KVCache.rows), contiguous; slots, blocks: integers on the device."""
    row_words = pool_words.shape[1]
    if count == 0:
        return
    parts = triton.cdiv(row_words, BLOCK_WORDS)
    programs = min(count * parts, max(1, _sm_count(pool_words.device) // SM_SHARE))
    _load_layer_kernel[(programs,)](
        host_words,
        pool_words,
        slots,
        blocks,
        count,
        layer,
        host_words.stride(0),
        row_words,
        _layer_rows(host_words, pool_words),
        BLOCK=BLOCK_WORDS,
        num_warps=8,
    )


def load_layer_torch(
    host_words: torch.Tensor,
    pool_words: torch.Tensor,
    slots: torch.Tensor,
    blocks: torch.Tensor,
    layer: int,
    count: int,
):
    """What `load_layer` does, with torch's index ops: the CPU's path, and the kernel's reference."""
    row_words = pool_words.shape[1]
    rows = blocks[:count].long() + layer * _layer_rows(host_words, pool_words)
    layer_words = host_words[:, layer * row_words : (layer + 1) * row_words]
    pool_words.index_copy_(0, rows, layer_words.index_select(0, slots[:count].long()))


def _layer_rows(host_words: torch.Tensor, pool_words: torch.Tensor) -> int:
    """A layer's rows in the pool: its rows over the layers a slot holds."""
    num_layers = host_words.shape[1] // pool_words.shape[1]
    return pool_words.shape[0] // num_layers


def mapped_on_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU uint8 [num_slots, slot_bytes] tensor over page-locked memory, its rows
    contiguous and 8-byte multiples apart) as int64 words a kernel on `device` reads, over the same
    memory. It takes page-locked memory to have the same address on the device as on the host, as
    on x86-64 Linux's unified addressing (cudaDevAttrCanUseHostPointerForRegisteredMem); the
    tests/gpu/test_kv_transfer.py round trips check it. The caller keeps `host`'s memory alive and
    registered while the view is used."""
    rows, row_bytes = host.shape
    interface = {
        "shape": (rows, row_bytes // 8),
        "typestr": "<i8",
        "data": (host.data_ptr(), False),
        "strides": (host.stride(0), 8),
        "version": 3,
    }
    return torch.as_tensor(_ArrayInterface(interface), device=device)


class _ArrayInterface:
    def __init__(self, interface: dict) -> None:
        self.__cuda_array_interface__ = interface


_SM_COUNTS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # Triton's interpreter, in the tests
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]
