"""Pinned host memory and its device twin: how a step's metadata reaches the GPU in one copy.

What travels is bundles: NamedTuples of numpy arrays, each field named for what its array is
(`BatchArrays`, `SamplingArrays`, ...). An upload hands each bundle back as the same NamedTuple of
device tensors, so no caller counts positions in a list of buffers.
"""

from typing import TypeVar

import numpy as np
import torch

_ALIGN = 16  # bytes; every array of the packed buffer starts aligned, so any dtype can view it

# The arrays of a bundle: numpy on the host, torch tensors once uploaded.
Array = TypeVar("Array", np.ndarray, torch.Tensor)
Bundle = TypeVar("Bundle", bound=tuple)  # a NamedTuple of arrays


class Staging:
    """Pinned host memory and a device buffer: a step's bundles are laid out in the first and copied
    to the second in one transfer. Views of both stay valid until the next `upload`."""

    def __init__(self, device: torch.device, capacity_bytes: int = 1 << 20) -> None:
        self.device = device
        self._host = self._device = None
        self._grow(capacity_bytes)
        self._in_flight = torch.cuda.Event()
        # Looked up once: torch.cuda.current_stream() costs tens of microseconds of host time.
        self._stream = torch.cuda.current_stream(device)

    def _grow(self, capacity_bytes: int) -> None:
        capacity_bytes = -(-capacity_bytes // _ALIGN) * _ALIGN  # so every dtype views the whole buffer
        self._host = torch.empty(capacity_bytes, dtype=torch.uint8, pin_memory=True)
        self._host_np = self._host.numpy()
        self._host_as = host_views_by_dtype(self._host)
        self._device = torch.empty(capacity_bytes, dtype=torch.uint8, device=self.device)

    def upload(self, *bundles: Bundle | None) -> tuple[Bundle | None, ...]:
        """Each bundle (a NamedTuple of numpy arrays, or None) as the same NamedTuple of device
        views, in the order given; None stays None."""
        arrays = [a for bundle in bundles if bundle is not None for a in bundle]
        offsets, total = aligned_offsets(arrays)
        # The last step's copies (ours and the kernels' planners') must have read the pinned memory.
        self._in_flight.synchronize()
        if total > self._host.numel():
            self._grow(max(total, 2 * self._host.numel()))
        for a, offset in zip(arrays, offsets):
            self._host_np[offset : offset + a.nbytes] = np.ascontiguousarray(a).view(np.uint8)
        self._device[:total].copy_(self._host[:total], non_blocking=True)
        return views_of(bundles, self._device, offsets)

    def pinned(self, view: torch.Tensor) -> torch.Tensor:
        """The pinned host copy of `view`, an array of the last `upload`: what a kernel planner reads
        on the host (no device sync) of what its kernels read on the device."""
        return same_place(self._host_as, view)

    def release(self) -> None:
        """Call once the step's transfers are all enqueued: the next upload waits for them."""
        self._in_flight.record(self._stream)


def on_cpu(bundle: Bundle | None) -> Bundle | None:
    """The bundle as CPU tensors over the same memory: what stands in for an upload on the CPU."""
    return None if bundle is None else type(bundle)._make(map(torch.from_numpy, bundle))


def aligned_offsets(arrays: list[np.ndarray]) -> tuple[list[int], int]:
    """Where each array starts in the packed buffer (in bytes, aligned) and the bytes all take."""
    offsets, total = [], 0
    for a in arrays:
        total = -(-total // _ALIGN) * _ALIGN
        offsets.append(total)
        total += a.nbytes
    return offsets, total


def views_of(bundles: tuple[Bundle | None, ...], buffer: torch.Tensor, offsets: list[int]) -> tuple[Bundle | None, ...]:
    """The bundles rebuilt over `buffer` (bytes, uint8): each array a 1-D view at its offset, of its
    dtype. `offsets` run over the arrays of the bundles that are not None, in order."""
    starts = iter(offsets)
    return tuple(
        None if bundle is None else type(bundle)._make([_view(buffer, next(starts), a) for a in bundle])
        for bundle in bundles
    )


def host_views_by_dtype(buffer: torch.Tensor) -> dict[torch.dtype, torch.Tensor]:
    """`buffer` (bytes, uint8, a multiple of _ALIGN long) viewed whole as each dtype a bundle may hold."""
    return {dtype: buffer.view(dtype) for dtype in _TORCH_DTYPES.values()}


def same_place(buffer_as: dict[torch.dtype, torch.Tensor], view: torch.Tensor) -> torch.Tensor:
    """What lies in a buffer, given viewed whole by dtype, where `view` (a 1-D view of a buffer laid
    out alike) lies in its own: the same storage offset, in elements of its dtype."""
    start = view.storage_offset()
    return buffer_as[view.dtype][start : start + view.numel()]


def _view(buffer: torch.Tensor, offset: int, a: np.ndarray) -> torch.Tensor:
    return buffer[offset : offset + a.nbytes].view(_TORCH_DTYPES[a.dtype.type])


_TORCH_DTYPES = {np.int32: torch.int32, np.int64: torch.int64, np.float32: torch.float32}
