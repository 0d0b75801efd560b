"""Streams a safetensors file onto a device at the disk's speed.

A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's
dtype, shape and byte range, then the tensors' bytes back to back. `safetensors.safe_open` maps the
file and copies one tensor at a time, so the disk idles while each copy runs: llama-3.1-8b loaded at
0.81-0.87 of the disk's sequential read rate on the H100 host that way. Here worker threads read the
file in large chunks into host buffers (pinned for a GPU), a few chunks ahead, while the GPU's copy
engine moves the bytes of the chunks already read into the tensors.
"""

import json
import math
import os
import struct
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import torch

CHUNK_BYTES = 64 << 20  # a read this large keeps the disk's queue full
# Chunks read at once, each into a buffer of its own. From the disk one read reaches its rate; from
# the page cache a read is a memory copy on one core, about 5 GB/s on the H100 host, so several run.
READERS = 4
HEADER_LENGTH_BYTES = 8

DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # its bytes in the file: [begin, end)
    end: int


def read_header(path: Path) -> list[StoredTensor]:
    """The file's tensors in the order of their bytes; ValueError when the header does not describe
    a whole, well-formed file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw_length = f.read(HEADER_LENGTH_BYTES)
        if len(raw_length) < HEADER_LENGTH_BYTES:
            raise ValueError(f"{path} is not a safetensors file: it is shorter than a header length")
        (length,) = struct.unpack("<Q", raw_length)
        if length > size - HEADER_LENGTH_BYTES:
            raise ValueError(f"{path} is not a safetensors file, or is cut short: its header would end past the file")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise ValueError(f"{path}: the safetensors header is not JSON ({exc})") from None
    data_start = HEADER_LENGTH_BYTES + length
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}, which this loader does not read")
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        if end - begin != math.prod(shape) * dtype.itemsize or data_start + end > size:
            raise ValueError(f"{path}: the bytes of {name} ({begin}..{end}) do not hold {info['dtype']} {list(shape)}"
                             " inside the file; it is corrupt or cut short")
        tensors.append(StoredTensor(name, dtype, shape, data_start + begin, data_start + end))
    return sorted(tensors, key=attrgetter("begin"))


def stream_tensors(
    path: Path, tensors: list[StoredTensor], device: torch.device, on_bytes_read: Callable[[int], None] = lambda n: None
) -> Iterator[tuple[StoredTensor, torch.Tensor]]:
    """Yields each of `tensors` (entries of `read_header(path)`, in its order) as a tensor on `device`
    once its copy is enqueued; later work on the device's current stream runs after that copy."""
    if not tensors:
        return
    on_gpu = device.type == "cuda"
    first, end = tensors[0].begin, tensors[-1].end
    chunks = [(offset, min(CHUNK_BYTES, end - offset)) for offset in range(first, end, CHUNK_BYTES)]
    buffers = [torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=on_gpu) for _ in range(min(READERS, len(chunks)))]
    pending = iter(tensors)
    current = next(pending, None)
    target = None  # the bytes of `current` on the device
    with open(path, "rb", buffering=0) as f, ThreadPoolExecutor(len(buffers)) as readers:

        def read(k: int) -> Future:
            offset, size = chunks[k]
            return readers.submit(_read_at, f.fileno(), buffers[k % len(buffers)].numpy()[:size], offset, path)

        reads = deque(read(k) for k in range(len(buffers)))
        for k, (chunk_begin, size) in enumerate(chunks):
            reads.popleft().result()
            on_bytes_read(size)
            buffer, chunk_end = buffers[k % len(buffers)], chunk_begin + size
            while current is not None and current.begin < chunk_end:
                if target is None:
                    tensor = torch.empty(current.shape, dtype=current.dtype, device=device)
                    target = tensor.reshape(-1).view(torch.uint8)
                start, stop = max(current.begin, chunk_begin), min(current.end, chunk_end)
                target[start - current.begin : stop - current.begin].copy_(
                    buffer[start - chunk_begin : stop - chunk_begin], non_blocking=on_gpu
                )
                if stop < current.end:
                    break  # the rest of it is in the next chunk
                yield current, tensor
                current, target = next(pending, None), None
            if on_gpu:
                torch.cuda.current_stream(device).synchronize()  # the buffer's bytes are on the device: refill it
            if k + len(buffers) < len(chunks):
                reads.append(read(k + len(buffers)))
    for stored in [current, *pending] if current is not None else []:  # empty tensors after the last byte
        yield stored, torch.empty(stored.shape, dtype=stored.dtype, device=device)


def _read_at(fd: int, view, offset: int, path: Path) -> None:
    """Fills `view` from the file at `offset`; ValueError if the file ends first."""
    filled, memory = 0, memoryview(view)
    while filled < len(memory):
        n = os.preadv(fd, [memory[filled:]], offset + filled)
        if not n:
            raise ValueError(f"{path} ends before the tensors its header lists: it is cut short")
        filled += n
