"""A torch.distributed group between a trainer (rank 0, who broadcasts) and the servers that take
its weights: the transport of `update_weights_from_distributed`.

The group is a backend object of its own, made from a TCP store at the trainer's address, never the
default process group: an executor is no member of the trainer's world, and a group that breaks
(its trainer died) is dropped and joined again without touching anything else. Store keys and
construction follow torch's `_new_process_group_helper`, as SGLang's `init_custom_process_group`
calls it, so a trainer that made its group that way meets ours: keys under `<group_name>/<device>/`,
gloo built for the cpu and cuda devices in that order, NCCL for cuda.

A broadcast from rank 0 is posted for each tensor (or once for a flattened bucket: SGLang's
`FlattenedTensorBucket`, the tensors' bytes end to end, in order, whatever their dtypes). Nothing
waits on the host until the update's end: NCCL's work only orders the device's streams, and the
update's one wait (`settle`) is polled against a deadline, so a trainer that dies mid-broadcast
costs the deadline, not the executor: the communicator is aborted, which ends its kernels.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

# NVLink multicast stays off in every process that joins a group: on hosts whose GPUs others share,
# a program using it can put them out of service.
os.environ["NCCL_NVLS_ENABLE"] = "0"
# Errors are handled here (abort, drop the group); torch's default would end the whole process.
os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")

_POLL_S = 0.0005  # between looks at a broadcast's completion: far below a broadcast's own time
_NEVER = timedelta(days=365)  # collectives time out by our deadline, not by torch's watchdog


class GroupError(RuntimeError):
    """The group broke or a deadline passed; it is aborted and must be joined again."""


class WeightGroup:
    """One member's side of the group; rank 0 broadcasts, the others receive."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        device: torch.device,
        timeout_s: float,
    ) -> None:
        """Joins: returns once every rank has (raises on a timeout)."""
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be nccl or gloo, not {backend!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not within a world of {world_size}")
        if backend == "nccl" and device.type != "cuda":
            raise ValueError("the nccl backend needs a CUDA device; use gloo on the CPU")
        self.name, self.rank, self.device = group_name, rank, device
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
        prefix = dist.PrefixStore(f"{group_name}/", store)
        self._store = store  # the trainer's store serves the others' lookups while the group lives
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = _NEVER
            self._backend = dist.ProcessGroupNCCL(dist.PrefixStore("cuda/", prefix), rank, world_size, options)
            self._backend._set_sequence_number_for_group()  # the communicator is made by the first broadcast
        else:
            backends = {}
            for kind in ("cpu", "cuda"):
                backends[kind] = dist.ProcessGroupGloo(dist.PrefixStore(f"{kind}/", prefix), rank, world_size, _NEVER)
                backends[kind]._set_sequence_number_for_group()
            self._backend = backends[device.type]
            self._spare = backends  # the other device's: the trainer may have made it, so we make it too
        self._nccl = backend == "nccl"
        self._pending: list[dist.Work] = []
        self.aborted = False

    def send(self, tensors: list[torch.Tensor], flattened: bool, deadline: float) -> None:
        """Rank 0: broadcasts `tensors` in order (as one bucket of their bytes when `flattened`) and
        waits until they are sent, until `deadline` (time.monotonic) at the latest."""
        if flattened:
            self._broadcast(torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]))
        else:
            for tensor in tensors:
                self._broadcast(tensor.detach().contiguous())
        self._arrived(deadline)
        self.settle(deadline)

    def receive(
        self, likes: list[torch.Tensor], flattened: bool, deadline: float
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Receives the broadcasts of tensors shaped like `likes`, in order (one bucket of their
        bytes when `flattened`), into buffers of their own, never into `likes`: an update checks
        what arrived before it writes a byte of the live weights. On NCCL the receive is ordered on
        the current stream and the host does not wait (`settle` does); on gloo the host waits,
        until `deadline` at the latest. Returns the received tensors and, when flattened, the
        bucket they are views of ([bytes] uint8)."""
        if flattened:
            bucket = torch.empty(sum(_nbytes(t) for t in likes), dtype=torch.uint8, device=self.device)
            self._broadcast(bucket)
            self._arrived(deadline)
            return bucket_views(bucket, likes), bucket
        buffers = [torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in likes]
        for buffer in buffers:
            self._broadcast(buffer)
        self._arrived(deadline)
        return buffers, None

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        self._pending.append(self._backend.broadcast([tensor], options))

    def _arrived(self, deadline: float) -> None:
        """Orders what comes next after the broadcasts posted: on NCCL the current stream waits for
        them, the host does not; on gloo the host waits, until `deadline` at the latest."""
        pending, self._pending = self._pending, []
        if self._nccl:
            for work in pending:
                work.wait()
            return
        for work in pending:
            self._await(work.is_completed, deadline)
            try:
                work.wait()
            except RuntimeError as exc:  # a member left: its connections closed
                self.abort()
                raise GroupError(f"a broadcast in group {self.name} failed: {exc}") from None

    def settle(self, deadline: float) -> None:
        """Waits, until `deadline` at the latest, for all the device work queued so far on the
        current stream (after `arrived`: the broadcasts and what read them)."""
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
            self._await(done.query, deadline)

    def _await(self, finished, deadline: float) -> None:
        while not finished():
            if time.monotonic() >= deadline:
                self.abort()
                raise GroupError(f"group {self.name}: the broadcast did not finish by its deadline")
            time.sleep(_POLL_S)

    def abort(self) -> None:
        """Ends the group's communication at once (its pending collectives fail)."""
        self._pending, self.aborted = [], True
        self._backend.abort()


def bucket_views(bucket: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors packed end to end in `bucket` ([bytes] uint8), as views with the dtypes and
    shapes of `like` (copies where a tensor's bytes start off its dtype's alignment)."""
    views, offset = [], 0
    for tensor in like:
        raw = bucket[offset : offset + _nbytes(tensor)]
        offset += _nbytes(tensor)
        if raw.data_ptr() % tensor.element_size():
            raw = raw.clone()
        views.append(raw.view(tensor.dtype).view(tensor.shape))
    return views


def dtype_runs(bucket: torch.Tensor, like: list[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """The bucket's bytes cut into runs of neighbours of one dtype, each as one tensor of that dtype
    (with the indices of the tensors in it): what one check can cover at once. A run breaks where a
    tensor's bytes start off its dtype's alignment."""
    runs: list[tuple[list[int], torch.Tensor]] = []
    start = offset = 0
    members: list[int] = []
    for index, tensor in enumerate(like + [None]):
        if members and (tensor is None or tensor.dtype != like[members[0]].dtype or offset % tensor.element_size()):
            runs.append((members, bucket[start:offset].view(like[members[0]].dtype)))
            members, start = [], offset
        if tensor is not None:
            if not members and offset % tensor.element_size():
                runs.append(([index], bucket[offset : offset + _nbytes(tensor)].clone().view(tensor.dtype)))
                offset = start = offset + _nbytes(tensor)
                continue
            members.append(index)
            offset += _nbytes(tensor)
    return runs


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
