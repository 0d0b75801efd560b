"""Pinned host memory and its device twin: how a step's metadata reaches the GPU in one copy."""

import numpy as np
import torch

_ALIGN = 16  # bytes; every array of the packed buffer starts aligned, so any dtype can view it


class Staging:
    """Pinned host memory and a device buffer: a step's arrays are laid out in the first and copied
    to the second in one transfer. Views of both stay valid until the next `upload`."""

    def __init__(self, device: torch.device, capacity_bytes: int = 1 << 20) -> None:
        self.device = device
        self._host = self._device = None
        self._grow(capacity_bytes)
        self._in_flight = torch.cuda.Event()
        # Looked up once: torch.cuda.current_stream() costs tens of microseconds of host time.
        self._stream = torch.cuda.current_stream(device)

    def _grow(self, capacity_bytes: int) -> None:
        self._host = torch.empty(capacity_bytes, dtype=torch.uint8, pin_memory=True)
        self._host_np = self._host.numpy()
        self._device = torch.empty(capacity_bytes, dtype=torch.uint8, device=self.device)

    def upload(
        self, arrays: list[np.ndarray], host_views_of: tuple[int, ...] = ()
    ) -> tuple[list[torch.Tensor], dict[int, torch.Tensor]]:
        """Returns device views of `arrays`, in order, and pinned host views of those whose index is
        in `host_views_of`."""
        offsets, total = [], 0
        for a in arrays:
            total = -(-total // _ALIGN) * _ALIGN
            offsets.append(total)
            total += a.nbytes
        # The last step's copies (ours and the kernels' planners') must have read the pinned memory.
        self._in_flight.synchronize()
        if total > self._host.numel():
            self._grow(max(total, 2 * self._host.numel()))
        for a, offset in zip(arrays, offsets):
            self._host_np[offset : offset + a.nbytes] = np.ascontiguousarray(a).view(np.uint8)
        self._device[:total].copy_(self._host[:total], non_blocking=True)
        device_views = [
            self._device[offset : offset + a.nbytes].view(_TORCH_DTYPES[a.dtype.type])
            for a, offset in zip(arrays, offsets)
        ]
        host_views = {
            i: self._host[offsets[i] : offsets[i] + arrays[i].nbytes].view(_TORCH_DTYPES[arrays[i].dtype.type])
            for i in host_views_of
        }
        return device_views, host_views

    def release(self) -> None:
        """Call once the step's transfers are all enqueued: the next upload waits for them."""
        self._in_flight.record(self._stream)


_TORCH_DTYPES = {np.int32: torch.int32, np.int64: torch.int64, np.float32: torch.float32}
