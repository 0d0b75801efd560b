"""weight_sync -> executor, on `<ns>.executor.weights` (request and reply): what weight_sync asks of
the executor to carry out a trainer's request on `<ns>.admin.weights` (schemas/admin_weights.py):
load, join or leave the trainer's group, read, rename, sleep and wake. The executor runs each
between two steps, with no step in flight.
"""

import msgspec

from schemas.admin_weights import InitWeightGroup, WeightValues, WeightVersion
from schemas.sleep import GetMemory, MemoryState, ReleaseMemory, ResumeMemory


class DiskSource(msgspec.Struct, frozen=True, tag="disk"):
    model_path: str


class GroupSource(msgspec.Struct, frozen=True, tag="group"):
    group_name: str
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    flattened: bool  # one broadcast of all the tensors' bytes, in order, rather than one per tensor
    checksums: list[str] = []


class IpcSource(msgspec.Struct, frozen=True, tag="ipc"):
    serialized_named_tensors: list[bytes]
    flattened: bool


WeightSource = DiskSource | GroupSource | IpcSource


class ApplyWeights(msgspec.Struct, frozen=True, tag="apply_weights"):
    """Loads `source` into the live weights, validating each tensor before it is written; on any
    failure restores the old weights (gpu/host_weights.py) and answers an Error. `full`: every
    weight of the model must be in it (a checkpoint); else a subset may be."""

    update_id: str
    source: WeightSource
    version: str
    full: bool


class WeightsApplied(msgspec.Struct, frozen=True, tag="weights_applied"):
    version: str
    tensors: int
    bytes: int
    seconds: float


class JoinWeightGroup(msgspec.Struct, frozen=True, tag="join_weight_group"):
    group: InitWeightGroup


class LeaveWeightGroup(msgspec.Struct, frozen=True, tag="leave_weight_group"):
    group_name: str


class GroupJoined(msgspec.Struct, frozen=True, tag="group_joined"):
    group_name: str


class ReadWeight(msgspec.Struct, frozen=True, tag="read_weight"):
    name: str
    truncate_size: int


class SetVersion(msgspec.Struct, frozen=True, tag="set_version"):
    """Renames the version of the weights the executor serves (UpdateWeightVersion)."""

    version: str


ExecutorWeightsRequest = (
    ApplyWeights
    | JoinWeightGroup
    | LeaveWeightGroup
    | ReadWeight
    | SetVersion
    | ReleaseMemory
    | ResumeMemory
    | GetMemory
)
ExecutorWeightsReply = WeightsApplied | GroupJoined | WeightValues | WeightVersion | MemoryState
