"""The executor's copies of KV blocks between its pool (gpu/kv_cache.py) and the host tier's slots
(actors/cache_tier/host_segment.py), which the scheduler orders when blocks leave the GPU or come
back from the host or disk tiers.

A slot holds one block of every layer, contiguous ([num_layers, 2, block_size, kv_heads, head_dim]
in the pool's dtype), so a block crosses PCIe in one large copy: 2 MiB copies run at the link's
rate where the 64 KiB of one layer's block crawl. On CUDA a block set is gathered from the layers
(in one operation: they are views of one allocation, gpu/kv_cache.py) into a staging buffer on the
device, then copied per slot; the gathers run on one stream of this object's and the copies on
another, through two staging halves, so the copy engine moves one chunk while the next is
gathered, and neither waits on the step's work more than ordering requires.
"""

import math
from contextlib import nullcontext

import torch

from gpu.kv_cache import KVCache

# Both staging halves together: chunks of blocks (64 of llama-3.1-8b a half), never one large
# allocation. A chunk costs one gather (or scatter) of every layer's rows and a copy per run of
# slots, launched from the executor's step loop, so larger chunks launch less per block.
STAGING_BYTES = 256 << 20


class Transfer:
    """A copy under way: `done()` says, without blocking, whether it is done with the host slots (a
    save: they hold the blocks; a load: it has read them)."""

    def __init__(self, finished: torch.cuda.Event | None) -> None:
        self._finished = finished  # None: done already (the CPU copies synchronously)

    def done(self) -> bool:
        return self._finished is None or self._finished.query()

    def wait(self) -> None:
        if self._finished is not None:
            self._finished.synchronize()


class KVTransfer:
    """Copies between `kv`'s blocks and the rows of `host_slots` (uint8 [num_slots, slot_bytes],
    slot_bytes = KVCache.bytes_per_block of the pool's geometry; its rows may be further apart).

    The caller keeps a block and a slot out of other use until a copy between them is done: a saved
    block, and a slot being loaded, until its `Transfer.done()`. A device synchronize (the pool's
    release for sleep does one) waits for this object's streams too."""

    def __init__(self, kv: KVCache, host_slots: torch.Tensor) -> None:
        layer = kv.layers[0]
        self._kv = kv
        self._block_shape = (len(kv.layers), *layer.shape[1:])  # [num_layers, 2, block_size, kv_heads, head_dim]
        block_bytes = math.prod(self._block_shape) * layer.element_size()
        if host_slots.dtype != torch.uint8 or host_slots.dim() != 2 or host_slots.device.type != "cpu":
            found = f"{host_slots.dtype} {tuple(host_slots.shape)} on {host_slots.device}"
            raise ValueError(f"host_slots must be a CPU uint8 [num_slots, slot_bytes] tensor, got {found}")
        if host_slots.shape[1] != block_bytes or host_slots.stride(1) != 1 or host_slots.stride(0) % layer.itemsize:
            raise ValueError(f"host_slots rows must be {block_bytes} contiguous bytes (one block of every layer)")
        self.num_slots = host_slots.shape[0]
        # [num_slots, num_layers, 2, block_size, kv_heads, head_dim], over the same memory
        self._host = host_slots.view(layer.dtype).view(self.num_slots, *self._block_shape)
        # Consecutive slots are one copy where nothing lies between them.
        self._coalesce = host_slots.stride(0) == block_bytes
        self._device = layer.device
        self._registered: int | None = None  # the host address this object pinned, to unpin on close
        self._copies: torch.cuda.Stream | None = None  # host <-> staging, on the copy engine
        self._kernels: torch.cuda.Stream | None = None  # pool <-> staging gathers and scatters
        if self._device.type == "cuda":
            self._pin(host_slots, block_bytes)
            self._copies = torch.cuda.Stream(self._device)
            self._kernels = torch.cuda.Stream(self._device)
        # The CPU takes the same path, without streams, so its tests cover the chunks and runs.
        per_half = max(1, STAGING_BYTES // 2 // block_bytes)
        self._staging: list[torch.Tensor] | None = [  # each [per_half, num_layers, 2, block_size, kv_heads, head_dim]
            torch.empty(per_half, *self._block_shape, dtype=layer.dtype, device=self._device) for _ in range(2)
        ]
        self._free: list[torch.cuda.Event | None] = [None, None]  # per half: after it, nothing uses it

    def _pin(self, host_slots: torch.Tensor, block_bytes: int) -> None:
        """Page-locks the host slots for DMA, unless they are already (torch's pinned tensors)."""
        if host_slots.is_pinned():
            return
        span = (self.num_slots - 1) * host_slots.stride(0) + block_bytes
        with torch.cuda.device(self._device):
            error = int(torch.cuda.cudart().cudaHostRegister(host_slots.data_ptr(), span, 0))
        if error != 0:
            raise RuntimeError(f"cudaHostRegister of the {span} bytes of host_slots failed: cudaError {error}")
        self._registered = host_slots.data_ptr()

    def save(self, blocks: list[int], slots: list[int]) -> Transfer:
        """Host slot `slots[i]` <- pool block `blocks[i]`, every layer, of the pool as the work
        queued so far on the current stream leaves it; the current stream does not wait."""
        self._check(blocks, slots)
        self._wait(self._kernels, self._record(self._current()))
        rows, layers = self._rows(blocks), len(self._kv.layers)
        for half, start, stop in self._chunks(len(blocks)):
            staging = self._staging[half][: stop - start]
            with self._on(self._kernels):
                self._wait(self._kernels, self._free[half])
                torch.index_select(self._kv.rows, 0, rows[start * layers : stop * layers], out=self._as_rows(staging))
                gathered = self._record(self._kernels)
            with self._on(self._copies):
                self._wait(self._copies, gathered)
                for row, slot, count in self._runs(slots[start:stop]):
                    self._host[slot : slot + count].copy_(staging[row : row + count], non_blocking=True)
                self._free[half] = self._record(self._copies)
        return Transfer(self._record(self._copies))

    def load(self, slots: list[int], blocks: list[int]) -> Transfer:
        """Pool block `blocks[i]` <- host slot `slots[i]`, every layer; work queued afterwards on the
        current stream (the next step) sees the loaded blocks. The Transfer is done once the slots
        are read (another process may write them then)."""
        self._check(blocks, slots)
        # The blocks may have been freed by work still queued (overlap scheduling): writing them
        # waits for it; the copies from the host need not.
        self._wait(self._kernels, self._record(self._current()))
        rows, layers = self._rows(blocks), len(self._kv.layers)
        for half, start, stop in self._chunks(len(blocks)):
            staging = self._staging[half][: stop - start]
            with self._on(self._copies):
                self._wait(self._copies, self._free[half])
                for row, slot, count in self._runs(slots[start:stop]):
                    staging[row : row + count].copy_(self._host[slot : slot + count], non_blocking=True)
                arrived = self._record(self._copies)
            with self._on(self._kernels):
                self._wait(self._kernels, arrived)
                self._kv.rows.index_copy_(0, rows[start * layers : stop * layers], self._as_rows(staging))
                self._free[half] = self._record(self._kernels)
        self._wait(self._current(), self._record(self._kernels))
        return Transfer(self._record(self._copies))  # after the last copy out of the slots

    def close(self) -> None:
        """Waits for the copies under way and unpins what this object pinned; the pool and the host
        memory stay their owners'."""
        if self._staging is None:
            return
        for stream in (self._copies, self._kernels):
            if stream is not None:
                stream.synchronize()
        self._staging = None
        if self._registered is not None:
            with torch.cuda.device(self._device):
                error = int(torch.cuda.cudart().cudaHostUnregister(self._registered))
            if error != 0:
                raise RuntimeError(f"cudaHostUnregister of host_slots failed: cudaError {error}")
            self._registered = None

    def _check(self, blocks: list[int], slots: list[int]) -> None:
        # Checked here: an index out of range on the device is an assert that ends the CUDA context.
        if len(blocks) != len(slots):
            raise ValueError(f"blocks and slots must pair up, got {len(blocks)} blocks and {len(slots)} slots")
        for field, ids, count in (("blocks", blocks, self._kv.num_blocks), ("slots", slots, self.num_slots)):
            wrong = [i for i in ids if not 0 <= i < count]
            if wrong or len(set(ids)) != len(ids):
                found = f"{wrong[:8]} out of range" if wrong else "repeats"
                raise ValueError(f"{field} must be distinct ids in [0, {count}), got {found}")
        if self._staging is None:
            raise ValueError("this KVTransfer is closed")

    def _chunks(self, count: int) -> list[tuple[int, int, int]]:
        """(staging half, first, past last) of each chunk of `count` blocks, the halves in turn."""
        size = self._staging[0].shape[0]
        return [(k % 2, start, min(start + size, count)) for k, start in enumerate(range(0, count, size))]

    def _runs(self, slots: list[int]) -> list[tuple[int, int, int]]:
        """(staging row, first slot, count) of each copy: runs of consecutive slots where they are adjacent."""
        runs: list[tuple[int, int, int]] = []
        for row, slot in enumerate(slots):
            if self._coalesce and runs and runs[-1][1] + runs[-1][2] == slot:
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((row, slot, 1))
        return runs

    def _as_rows(self, staging: torch.Tensor) -> torch.Tensor:
        """Staged blocks [count, num_layers, ...] as the pool's rows of one layer's block each."""
        return staging.view(-1, self._kv.rows.shape[1])

    def _rows(self, blocks: list[int]) -> torch.Tensor:
        """The pool's rows of `blocks` (KVCache.row_ids), on the device: one gather or scatter moves
        a chunk of blocks of every layer."""
        host = torch.tensor(self._kv.row_ids(blocks), dtype=torch.long)
        if self._kernels is None:
            return host
        # From pinned memory, asynchronously: a copy from pageable memory may hold the host until
        # the kernels' stream reaches it, and that stream has just been told to wait for the step.
        with torch.cuda.stream(self._kernels):
            return host.pin_memory().to(self._device, non_blocking=True)

    # Stream plumbing, which does nothing on the CPU (no streams; every copy done when it returns).

    def _current(self) -> torch.cuda.Stream | None:
        return torch.cuda.current_stream(self._device) if self._kernels is not None else None

    @staticmethod
    def _on(stream: torch.cuda.Stream | None):
        return torch.cuda.stream(stream) if stream is not None else nullcontext()

    @staticmethod
    def _record(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        return stream.record_event() if stream is not None else None

    @staticmethod
    def _wait(stream: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> None:
        if stream is not None and event is not None:
            stream.wait_event(event)
