"""The executor's one door for new weights: from a safetensors directory, from a trainer's
torch.distributed group, or from tensors a colocated trainer shares by CUDA IPC. Each update is all
or nothing. What can be checked before a byte moves (names, shapes, dtypes: headers, metadata) is.
The values' checks (NaN or infinity, the trainer's checksums) run on the device and are read back
in one sync per update, so the host never waits on the device per tensor:
- from a group or by IPC, the tensors are checked where they arrive (a buffer of their own, or the
  trainer's memory) and only then copied into the live weights: a refused update wrote nothing, so
  it needs no copy of the old weights, and a trainer's stream of bucketed updates pays none;
- from disk, the tensors stream into the live weights as they are read, so a failure restores the
  weights from their host copy (gpu/host_weights.py), taken first unless it is current; on disk
  updates take seconds and that copy about 0.3 s of 16 GB.

Every method is synchronous: the executor calls them in a worker thread, between steps, with no
step in flight, so nothing reads the weights while an update writes them.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gpu.host_weights import HostWeights
from gpu.ipc_tensors import open_payload
from gpu.live_weights import LiveWeights, TensorSpec, parse_dtype
from gpu.safetensors_stream import StoredTensor, read_header, stream_tensors
from gpu.weight_check import DeferredChecks, WeightError, adjacent_runs, checksum, finite_on_device
from gpu.weight_group import GroupError, WeightGroup, dtype_runs
from gpu.weights import checkpoint_files

# Tensors some checkpoints carry that are recomputed, never loaded (as gpu/weights.py skips them).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
_REFUSED = "nothing was written: the old weights serve on"


@dataclass(frozen=True)
class UpdateReport:
    tensors: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class WeightReading:
    shape: tuple[int, ...]
    dtype: str  # "bfloat16"
    values: list[float]  # the first `truncate_size` rows (dim 0), flattened: SGLang's answer with `shape`
    checksum: str  # gpu/weight_check.py's, of the whole tensor as served


class WeightReceiver:
    def __init__(self, model: nn.Module, host: HostWeights, device: torch.device | str) -> None:
        self.live = LiveWeights(model)
        self.host = host
        self.device = torch.device(device)
        self._groups: dict[str, WeightGroup] = {}
        # The finite check's kernels load at their first use, which takes tens of milliseconds:
        # now, not in the first update a trainer times.
        finite_on_device(torch.zeros(1, dtype=torch.bfloat16, device=self.device)).item()

    def apply_disk(self, model_path: str | Path) -> UpdateReport:
        """A full update from a checkpoint directory of the served architecture, streamed at the
        disk's read rate (gpu/safetensors_stream.py). Floating-point tensors are converted to the
        served dtype, as at load time; a tied head stored beside the embedding is skipped, as then."""
        start = time.perf_counter()
        plan = self._disk_plan(Path(model_path))
        specs = [TensorSpec(t.name, t.dtype, t.shape) for tensors in plan.values() for t in tensors]
        self.live.check(specs, full=True, convert=True)
        with self._rollback_on_failure() as checks:
            for file, tensors in plan.items():
                for stored, tensor in stream_tensors(file, tensors, self.device):
                    checks.finite([stored.name], self.live.write(stored.name, tensor))
        return UpdateReport(len(specs), sum(s.nbytes for s in specs), time.perf_counter() - start)

    def join_group(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float,
    ) -> None:
        """Joins the trainer's weight group at `rank`; returns once every member has joined.
        Joining a name already joined leaves the old group first (a trainer that restarted)."""
        self.leave_group(group_name)
        try:
            self._groups[group_name] = WeightGroup(
                master_address, master_port, rank, world_size, group_name, backend, self.device, timeout_s
            )
        except (ValueError, RuntimeError) as exc:  # a bad argument, or the rendezvous timed out
            raise WeightError(
                f"cannot join weight group {group_name} at {master_address}:{master_port}: {exc}"
            ) from None

    def leave_group(self, group_name: str) -> None:
        group = self._groups.pop(group_name, None)
        if group is not None:
            group.abort()

    def group(self, group_name: str) -> WeightGroup:
        """The joined group `group_name`; WeightError when there is none."""
        group = self._groups.get(group_name)
        if group is None:
            raise WeightError(f"weight group {group_name} is not joined: init it first")
        return group

    def apply_group(
        self,
        group_name: str,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        flattened: bool,
        checksums: list[str],
        deadline_s: float,
        full: bool = False,
    ) -> UpdateReport:
        """Receives the tensors the trainer broadcasts over `group_name` (in this order; as one
        bucket when `flattened`) into the live weights. Every broadcast is received as described
        even when the tensors are refused, so the trainer's collectives end (a description that
        disagrees with what the trainer sends breaks the group); if they have not ended after
        `deadline_s` (the trainer died or hung), the group is aborted and dropped: join again.
        `checksums`: the trainer's, one per tensor, or none."""
        start = time.perf_counter()
        deadline = time.monotonic() + deadline_s
        group = self.group(group_name)
        specs = _group_specs(names, dtypes, shapes, checksums)
        try:
            self.live.check(specs, full)
            self._check_fillable(full)
        except WeightError:
            self._receive_and_drop(group, specs, flattened, deadline)
            raise
        likes = [self.live.read(spec.name) for spec in specs]
        checks = DeferredChecks()
        try:
            arrived, bucket = group.receive(likes, flattened, deadline)
            if bucket is None:
                for spec, tensor in zip(specs, arrived):
                    checks.finite([spec.name], tensor)
            for members, values in [] if bucket is None else dtype_runs(bucket, likes):
                checks.finite([specs[i].name for i in members], values)  # a bucket's run in one pass
            for spec, tensor, expected in zip(specs, arrived, checksums):
                checks.checksum(spec.name, tensor, expected)
            group.settle(deadline)
        except GroupError as exc:
            self._groups.pop(group_name, None)
            raise WeightError(f"{exc}; {_REFUSED}") from None
        self._write_checked(specs, arrived, checks, full)
        return UpdateReport(len(specs), sum(s.nbytes for s in specs), time.perf_counter() - start)

    def apply_ipc(self, payloads: list[bytes], flattened: bool, full: bool = False) -> UpdateReport:
        """Copies the tensors a colocated trainer shares (SGLang's `serialized_named_tensors`,
        opened by gpu/ipc_tensors.py's restricted unpickler; each payload a list of named tensors,
        or a flattened bucket) into the live weights, device to device. Returns once the copies
        are done: the trainer may then reuse its memory."""
        start = time.perf_counter()
        opened = [pair for data in payloads for pair in open_payload(data, flattened, self.device)]
        specs = [spec for spec, _ in opened]
        self.live.check(specs, full)
        self._check_fillable(full)
        checks = DeferredChecks()
        for names, values in adjacent_runs([(spec.name, tensor) for spec, tensor in opened]):
            checks.finite(names, values)
        self._write_checked(specs, [tensor for _, tensor in opened], checks, full)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # done with the trainer's memory
        return UpdateReport(len(specs), sum(s.nbytes for s in specs), time.perf_counter() - start)

    def _receive_and_drop(self, group: WeightGroup, specs: list[TensorSpec], flattened: bool, deadline: float) -> None:
        """Takes the broadcasts of an update refused before any write, keeping the group in step."""
        # Shapes and dtypes only (no memory): `receive` allocates what the broadcasts land in.
        like = lambda spec: torch.empty(spec.shape, dtype=spec.dtype, device="meta")
        try:
            if flattened:
                group.receive([like(spec) for spec in specs], True, deadline)
            for spec in [] if flattened else specs:  # one at a time: the memory of one tensor at once
                group.receive([like(spec)], False, deadline)
            group.settle(deadline)
        except GroupError:
            self._groups.pop(group.name, None)

    def read(self, name: str, truncate_size: int) -> WeightReading:
        """The served values of weight `name`: its first `truncate_size` rows and the checksum of
        the whole. For inspection: it syncs and copies those rows to the host."""
        if truncate_size < 0:
            raise WeightError(f"truncate_size must be 0 or more, not {truncate_size}")
        live = self.live.read(name)
        rows = live[:truncate_size] if live.dim() else live
        values = rows.detach().float().reshape(-1).cpu().tolist()
        return WeightReading(tuple(live.shape), str(live.dtype).removeprefix("torch."), values, checksum(live))

    def _disk_plan(self, model_dir: Path) -> dict[Path, list[StoredTensor]]:
        """{file: the tensors to read from it}; WeightError when the directory is no checkpoint."""
        try:
            contents = {file: read_header(file) for file in checkpoint_files(model_dir)}
        except (OSError, ValueError) as exc:
            raise WeightError(f"cannot read a checkpoint in {model_dir}: {exc}") from None
        skipped = lambda name: name.endswith(_IGNORED_SUFFIXES) or (self.live.tied_head and name == "lm_head.weight")
        return {file: [t for t in stored if not skipped(t.name)] for file, stored in contents.items()}

    def _write_checked(
        self, specs: list[TensorSpec], arrived: list[torch.Tensor], checks: DeferredChecks, full: bool
    ) -> None:
        """Waits for the checks of tensors that arrived outside the live weights and, if all pass,
        copies them in (device to device, on the current stream). WeightError, with nothing
        written, if one fails."""
        by_name = dict(zip((spec.name for spec in specs), arrived))
        try:
            checks.verify(by_name.__getitem__)
        except WeightError as exc:
            raise WeightError(f"{exc}; {_REFUSED}") from None
        self._make_writable()
        self.host.changed()
        for spec, tensor in zip(specs, arrived):
            self.live.write(spec.name, tensor)

    @contextmanager
    def _rollback_on_failure(self) -> Iterator[DeferredChecks]:
        """Runs a full update's writes (the body) and then its checks; if either fails, restores the
        weights the host copy holds and raises WeightError. The copy is taken first if the weights
        changed since it was."""
        serving = self._make_writable()
        if serving and not self.host.current:
            self.host.refresh()
        checks = DeferredChecks()
        try:
            self.host.changed()
            yield checks
            checks.verify(self.live.read)
        except Exception as exc:
            if serving:
                self.host.restore()
                outcome = "the old weights are restored"
            else:
                outcome = "the weights were dropped, so none serve until a full update succeeds"
            if isinstance(exc, WeightError):
                raise WeightError(f"{exc}; {outcome}") from None
            raise WeightError(f"the update failed ({type(exc).__name__}: {exc}); {outcome}") from exc

    def _check_fillable(self, full: bool) -> None:
        if self.host.released and self.host.copies is None and not full:
            raise WeightError("the weights were dropped: only a full update can fill them")

    def _make_writable(self) -> bool:
        """Gives released weights device memory again: the host copy's, or, where they were dropped
        (released with no copy, for a full update to fill), uninitialised. Whether the weights hold
        served values (False: dropped)."""
        if not self.host.released:
            return True
        if self.host.copies is None:
            self.host.reallocate()
            return False
        self.host.restore()
        return True


def _group_specs(
    names: list[str], dtypes: list[str], shapes: list[list[int]], checksums: list[str]
) -> list[TensorSpec]:
    """The specs of a distributed update; WeightError when its lists disagree or a field is malformed."""
    if not len(names) == len(dtypes) == len(shapes):
        raise WeightError(f"names, dtypes and shapes must be as long: {len(names)}, {len(dtypes)}, {len(shapes)}")
    if checksums and len(checksums) != len(names):
        raise WeightError(f"checksums must be one per name or none: {len(checksums)} for {len(names)} names")
    specs = []
    for name, dtype, shape in zip(names, dtypes, shapes):
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise WeightError(f"{name}: shape {shape} is not a list of sizes")
        specs.append(TensorSpec(name, parse_dtype(dtype), tuple(shape)))
    return specs
