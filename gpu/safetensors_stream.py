"""Streams a safetensors file onto a device at the disk's speed.

A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's
dtype, shape and byte range in the data that follows, and the data: the tensors' little-endian bytes
back to back, with no gap. `safetensors.safe_open` maps the file and copies one tensor at a time,
so the disk idles while each copy runs (docs/journal/benchmarks.md, section "Weight loading at
the disk's speed"). Here worker threads read the wanted tensors' bytes in large chunks into host
buffers (pinned for a GPU), a few chunks ahead, while the GPU's copy engine moves the bytes of the
chunks already read into the tensors. (torch runs on little-endian hosts only, so the bytes need
no swapping.)
"""

import json
import math
import os
import struct
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

CHUNK_BYTES = 64 << 20  # a read this large keeps the disk's queue full
# Chunks read at once, each into a buffer of its own. From the disk one read reaches its rate; from
# the page cache a read is a memory copy on one core, slower than the copy to the GPU, so several run.
READERS = 4
HEADER_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit

DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
    "C64": torch.complex64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
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
    """The file's tensors in the order of their bytes; ValueError, naming the file, when the header
    does not describe a whole, well-formed file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw_length = f.read(HEADER_LENGTH_BYTES)
        if len(raw_length) < HEADER_LENGTH_BYTES:
            raise ValueError(f"{path} is not a safetensors file: it is shorter than a header length")
        (length,) = struct.unpack("<Q", raw_length)
        if length > min(size - HEADER_LENGTH_BYTES, MAX_HEADER_BYTES):
            raise ValueError(f"{path} is not a safetensors file, or is cut short: its header would be {length} bytes")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise ValueError(f"{path}: the safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    data_start = HEADER_LENGTH_BYTES + length
    tensors = [_entry(path, name, info, data_start) for name, info in header.items() if name != "__metadata__"]
    tensors.sort(key=lambda t: (t.begin, t.end))  # an empty tensor before the one that starts where it does
    expected = data_start
    for tensor in tensors:  # the data is the tensors' bytes and nothing else
        if tensor.begin != expected:
            raise ValueError(
                f"{path}: the bytes of {tensor.name} start at {tensor.begin - data_start} in the data, "
                f"not at {expected - data_start} where the tensor before ends; the file is corrupt"
            )
        expected = tensor.end
    if expected != size:
        raise ValueError(
            f"{path}: the tensors' bytes end at {expected} but the file has {size}; it is corrupt or cut short"
        )
    return tensors


def _entry(path: Path, name: str, info, data_start: int) -> StoredTensor:
    try:
        dtype, shape, (begin, end) = DTYPES.get(info["dtype"]), tuple(info["shape"]), info["data_offsets"]
        well_formed = all(isinstance(n, int) and n >= 0 for n in (*shape, begin, end))
    except (KeyError, TypeError, ValueError):
        well_formed = False
    if not well_formed:
        raise ValueError(f"{path}: the header's entry for {name} is not a dtype, a shape and two byte offsets")
    if dtype is None:
        raise ValueError(f"{path}: {name} has dtype {info['dtype']}, which this loader does not read")
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise ValueError(
            f"{path}: the bytes of {name} ({begin}..{end}) do not hold {info['dtype']} {list(shape)}; "
            "the file is corrupt"
        )
    return StoredTensor(name, dtype, shape, data_start + begin, data_start + end)


def stream_tensors(
    path: Path, tensors: list[StoredTensor], device: torch.device, on_bytes_read: Callable[[int], None] = lambda n: None
) -> Iterator[tuple[StoredTensor, torch.Tensor]]:
    """Yields each of `tensors` (entries of `read_header(path)`, in its order; empty ones first) as a
    tensor on `device` once its copy is enqueued; later work on the device's current stream runs
    after that copy. Only their bytes are read."""
    for stored in tensors:
        if stored.begin == stored.end:  # in no chunk
            yield stored, torch.empty(stored.shape, dtype=stored.dtype, device=device)
    nonempty = [t for t in tensors if t.begin < t.end]
    if not nonempty:
        return
    chunks = _chunks_to_read(nonempty)
    on_gpu = device.type == "cuda"
    largest = max(size for _, size in chunks)
    buffers = [torch.empty(largest, dtype=torch.uint8, pin_memory=on_gpu) for _ in range(min(READERS, len(chunks)))]
    remaining = iter(nonempty)
    current, target = next(remaining), None  # the tensor being filled, and its bytes on the device
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
                current, target = next(remaining, None), None
            if on_gpu:
                torch.cuda.current_stream(device).synchronize()  # the buffer's bytes are on the device: refill it
            if k + len(buffers) < len(chunks):
                reads.append(read(k + len(buffers)))


def _chunks_to_read(tensors: list[StoredTensor]) -> list[tuple[int, int]]:
    """(offset, size) of each read: the byte ranges the tensors cover, neighbours merged, cut into
    reads of at most CHUNK_BYTES."""
    spans: list[list[int]] = []
    for stored in tensors:
        if spans and spans[-1][1] == stored.begin:
            spans[-1][1] = stored.end
        else:
            spans.append([stored.begin, stored.end])
    return [
        (offset, min(CHUNK_BYTES, end - offset)) for begin, end in spans for offset in range(begin, end, CHUNK_BYTES)
    ]


def _read_at(fd: int, view, offset: int, path: Path) -> None:
    """Fills `view` from the file at `offset`; ValueError if the file ends first."""
    filled, memory = 0, memoryview(view)
    while filled < len(memory):
        n = os.preadv(fd, [memory[filled:]], offset + filled)
        if not n:
            raise ValueError(f"{path} ends before the tensors its header lists: it is cut short")
        filled += n
