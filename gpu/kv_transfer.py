"""The executor's copies of KV blocks between its pool (gpu/kv_cache.py) and the host tier's slots
(actors/cache_tier/host_segment.py), which the scheduler orders when blocks leave the GPU or come
back from the host or disk tiers.

A slot holds one block of every layer, contiguous ([num_layers, 2, block_size, kv_heads, head_dim]
in the pool's dtype), so a saved block crosses PCIe in one large copy: 2 MiB copies run at the
link's rate where the 64 KiB of one layer's block crawl. On CUDA a block set to save is gathered
from the layers (in one operation: they are views of one allocation, gpu/kv_cache.py) into a
staging buffer on the device, then copied per slot; the gathers run on one stream and the copies on
another, through two staging halves, so the copy engine moves one chunk while the next is gathered.

A load, which a prompt's first token waits for, lands layer by layer instead: the GPU's threads
read each layer of the slots straight from the page-locked memory (gpu/kv_load_kernel.py) on a
stream of its own, and the step's forward pass attends over layer i once layer i has landed
(gpu/layer_arrivals.py), so the prompt computes while the later layers still cross. A save waits
for the loads still landing; a load waits for no save, and the two cross PCIe in both directions at
once.
"""

import math
from contextlib import nullcontext

import torch

from gpu.kv_cache import KVCache
from gpu.kv_load_kernel import load_layer, load_layer_torch, mapped_on_device

# The saves' two staging halves together: chunks of blocks (64 of llama-3.1-8b a half), never one
# large allocation. A chunk costs one gather of every layer's rows and a copy per run of slots,
# launched from the executor's step loop, so larger chunks launch less per block.
STAGING_BYTES = 256 << 20
CUDA_HOST_REGISTER_MAPPED = 2  # cudaHostRegisterMapped


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
    slot_bytes = KVCache.bytes_per_block of the pool's geometry; its rows may be further apart, by
    a multiple of 8 bytes).

    The caller keeps a block and a slot out of other use until a copy between them is done: a saved
    block, and a slot being loaded, until its `Transfer.done()`. Saves and loads run on streams of
    their own, and a slot being saved is not loaded from, nor a block being saved loaded into, until
    the save is done (the scheduler indexes a slot only once saved); a save waits for the loads
    still landing. A device synchronize (the pool's release for sleep does one) waits for this
    object's streams too."""

    def __init__(self, kv: KVCache, host_slots: torch.Tensor) -> None:
        layer = kv.layers[0]
        self._kv = kv
        self._block_shape = (len(kv.layers), *layer.shape[1:])  # [num_layers, 2, block_size, kv_heads, head_dim]
        block_bytes = math.prod(self._block_shape) * layer.element_size()
        if host_slots.dtype != torch.uint8 or host_slots.dim() != 2 or host_slots.device.type != "cpu":
            found = f"{host_slots.dtype} {tuple(host_slots.shape)} on {host_slots.device}"
            raise ValueError(f"host_slots must be a CPU uint8 [num_slots, slot_bytes] tensor, got {found}")
        if host_slots.shape[1] != block_bytes or host_slots.stride(1) != 1 or host_slots.stride(0) % 8:
            raise ValueError(
                f"host_slots rows must be {block_bytes} contiguous bytes (one block of every layer), "
                "a multiple of 8 bytes apart"
            )
        self.num_slots = host_slots.shape[0]
        # [num_slots, num_layers, 2, block_size, kv_heads, head_dim], over the same memory
        self._host = host_slots.view(layer.dtype).view(self.num_slots, *self._block_shape)
        # Consecutive slots are one copy where nothing lies between them.
        self._coalesce = host_slots.stride(0) == block_bytes
        self._device = layer.device
        self._registered: int | None = None  # the host address this object pinned, to unpin on close
        on_cuda = self._device.type == "cuda"
        if on_cuda:
            self._pin(host_slots, block_bytes)
        # The slots as 8-byte words, where the loads read them: the device's threads, on CUDA.
        self._host_words = mapped_on_device(host_slots, self._device) if on_cuda else host_slots.view(torch.int64)
        # The CPU takes the same paths, without streams, so its tests cover the chunks and runs.
        per_half = max(1, STAGING_BYTES // 2 // block_bytes)
        self._saves = _Lane(self._device, per_half, self._block_shape, layer.dtype)
        # A load stands between a prompt and its first token: its stream goes first.
        self._loads = torch.cuda.Stream(self._device, priority=-1) if on_cuda else None
        self._load_layer = load_layer if on_cuda else load_layer_torch
        self._closed = False
        if on_cuda:  # the kernel compiles now, not inside the first step that loads (slot 0 to scratch)
            slots, blocks = self._indices([0], [kv.scratch_block], torch.cuda.current_stream(self._device))
            load_layer(self._host_words, kv.rows.view(torch.int64), slots, blocks, 0, 1)
            torch.cuda.synchronize(self._device)

    def _pin(self, host_slots: torch.Tensor, block_bytes: int) -> None:
        """Page-locks the host slots for DMA and maps them for kernels, unless they are already
        (torch's pinned tensors, which unified addressing maps)."""
        if host_slots.is_pinned():
            return
        span = (self.num_slots - 1) * host_slots.stride(0) + block_bytes
        with torch.cuda.device(self._device):
            # Mapped: the loads' kernels read the slots at their host address (unified addressing).
            error = int(torch.cuda.cudart().cudaHostRegister(host_slots.data_ptr(), span, CUDA_HOST_REGISTER_MAPPED))
        if error != 0:
            raise RuntimeError(f"cudaHostRegister of the {span} bytes of host_slots failed: cudaError {error}")
        self._registered = host_slots.data_ptr()

    def save(self, blocks: list[int], slots: list[int]) -> Transfer:
        """Host slot `slots[i]` <- pool block `blocks[i]`, every layer, of the pool as the work
        queued so far on the current stream leaves it; the current stream does not wait."""
        self._check(blocks, slots)
        lane = self._saves
        _wait(lane.kernels, _record(self._current()))
        if lane.kernels is not None:
            self._kv.arrivals.wait_whole(lane.kernels)  # a block of a load still landing is read whole
        rows, layers = self._rows(blocks, lane), len(self._kv.layers)
        for half, start, stop in lane.chunks(len(blocks)):
            staging = lane.staging[half][: stop - start]
            with _on(lane.kernels):
                _wait(lane.kernels, lane.free[half])
                torch.index_select(self._kv.rows, 0, rows[start * layers : stop * layers], out=self._as_rows(staging))
                gathered = _record(lane.kernels)
            with _on(lane.copies):
                _wait(lane.copies, gathered)
                for row, slot, count in self._runs(slots[start:stop]):
                    self._host[slot : slot + count].copy_(staging[row : row + count], non_blocking=True)
                lane.free[half] = _record(lane.copies)
        return Transfer(_record(lane.copies))

    def load(self, slots: list[int], blocks: list[int]) -> Transfer:
        """Pool block `blocks[i]` <- host slot `slots[i]`, every layer, layer by layer: the forward
        pass queued next on the current stream attends over each layer once it has landed, and
        everything queued there after that pass sees the whole load (the pool's `arrivals`). The
        Transfer is done once the slots are read (another process may write them then)."""
        self._check(blocks, slots)
        stream = self._loads
        # The blocks may have been freed by work still queued (overlap scheduling): writing them
        # waits for it; reading the slots need not, but a layer is one kernel that does both.
        _wait(stream, _record(self._current()))
        slot_ids, block_ids = self._indices(slots, blocks, stream)
        pool_words = self._kv.rows.view(torch.int64)
        landed = []
        with _on(stream):
            for layer in range(len(self._kv.layers)):
                self._load_layer(self._host_words, pool_words, slot_ids, block_ids, layer, len(slots))
                landed.append(_record(stream))
        if stream is not None:
            self._kv.arrivals.add(landed, self._current())
        return Transfer(landed[-1])

    def close(self) -> None:
        """Waits for the copies under way and unpins what this object pinned; the pool and the host
        memory stay their owners'."""
        if self._closed:
            return
        self._saves.synchronize()
        if self._loads is not None:
            self._loads.synchronize()
        self._closed = True
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
        if self._closed:
            raise ValueError("this KVTransfer is closed")

    def _indices(
        self, slots: list[int], blocks: list[int], stream: torch.cuda.Stream | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A load's slot and block ids, int32 on the device (copied on `stream`): one copy of a
        [2, n] tensor whose rows are padded to 4 ids, so that each starts 16-byte aligned, as every
        launch of the kernel is compiled for."""
        padding = [0] * (-len(slots) % 4)
        indices = self._upload(torch.tensor([slots + padding, blocks + padding], dtype=torch.int32), stream)
        return indices[0], indices[1]

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

    def _rows(self, blocks: list[int], lane: "_Lane") -> torch.Tensor:
        """The pool's rows of `blocks` (KVCache.row_ids), on the device: one gather moves a chunk of
        blocks of every layer. Only the block ids cross: listing every layer's row on the host took
        milliseconds, before any copy."""
        ids = self._upload(torch.tensor(blocks, dtype=torch.long), lane.kernels)
        with _on(lane.kernels):
            return self._kv.row_ids(ids)

    def _upload(self, host: torch.Tensor, stream: torch.cuda.Stream | None) -> torch.Tensor:
        """`host` on the device, copied on `stream` (as it is on the CPU, with none): from pinned
        memory, asynchronously, since a copy from pageable memory may hold the host until the stream
        reaches it, and the stream has just been told to wait for the step."""
        if stream is None:
            return host
        with torch.cuda.stream(stream):
            return host.pin_memory().to(self._device, non_blocking=True)

    def _current(self) -> torch.cuda.Stream | None:
        return torch.cuda.current_stream(self._device) if self._device.type == "cuda" else None


class _Lane:
    """The saves' copies: a stream for the copy engine (staging -> host), one for the gathers (pool
    -> staging), and two staging halves, each [per_half, *block_shape], used in turn with the event
    after which nothing uses each. On the CPU: no streams, the same chunks."""

    def __init__(self, device: torch.device, per_half: int, block_shape: tuple, dtype: torch.dtype) -> None:
        on_cuda = device.type == "cuda"
        self.copies = torch.cuda.Stream(device) if on_cuda else None
        self.kernels = torch.cuda.Stream(device) if on_cuda else None
        self.staging = [torch.empty(per_half, *block_shape, dtype=dtype, device=device) for _ in range(2)]
        self.free: list[torch.cuda.Event | None] = [None, None]

    def chunks(self, count: int) -> list[tuple[int, int, int]]:
        """(staging half, first, past last) of each chunk of `count` blocks, the halves in turn."""
        size = self.staging[0].shape[0]
        return [(k % 2, start, min(start + size, count)) for k, start in enumerate(range(0, count, size))]

    def synchronize(self) -> None:
        for stream in (self.copies, self.kernels):
            if stream is not None:
                stream.synchronize()


# Stream plumbing, which does nothing on the CPU (no streams; every copy done when it returns).


def _on(stream: torch.cuda.Stream | None):
    return torch.cuda.stream(stream) if stream is not None else nullcontext()


def _record(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    return stream.record_event() if stream is not None else None


def _wait(stream: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> None:
    if stream is not None and event is not None:
        stream.wait_event(event)
