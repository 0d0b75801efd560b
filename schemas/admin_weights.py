"""Live weights, as a trainer asks for them: its conversation with the weight_sync actor on
`<ns>.admin.weights` (updates, the trainer's group, uploads over the bus, versions, reads, and
schemas/sleep.py's sleep and wake). weight_sync carries each out with the executor
(schemas/executor_weights.py) and, for an update, the scheduler (schemas/scheduler_weights.py).

These messages carry SGLang's field names and defaults (its `/update_weights_*`,
`/init_weights_update_group`, `/release_memory_occupation`... bodies), so an RL client's request
maps onto them one to one. Every update is one transaction, run by the weight_sync actor: pause
(as asked), load into the executor's live buffers, validate, commit (the new version), flush or
keep the KV computed under the old weights, resume. A failed one rolls back: the old weights keep
serving under the old version, and the reply is an `Error` naming what was wrong.

A weight version is a string, as in SGLang: the first weights are "default" (or `--weight-version`);
an update that names none gets the count of updates committed since start ("1", "2"...).
"""

from typing import Annotated, Literal

import msgspec

from schemas.sleep import GetMemory, MemoryState, ReleaseMemory, ResumeMemory

# How requests in flight live through an update that finds generation running (one already paused by
# `PauseGeneration` stays as it is, and the update leaves it paused): SGLang's default waits for
# them to finish; `abort_all_requests` ends them ("abort"); "in_place" holds them and lets them go
# on under the new weights (their tokens' versions then change mid-sequence: `version_spans`).
UpdatePause = Literal["wait", "abort", "retract", "in_place"]


class UpdateFromDisk(msgspec.Struct, frozen=True, tag="update_from_disk"):
    """Reads a safetensors directory (a checkpoint of the served architecture) into the live weights."""

    model_path: str
    load_format: str | None = None  # SGLang's; "auto", "safetensors" or None are what is served
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True  # False keeps the KV cached under the old weights servable
    pause_mode: UpdatePause | None = None  # None: "abort" with abort_all_requests, else "wait"


# A trainer and its servers' ranks: far beyond any deployment, and within torch's (int32) ranks.
MAX_WORLD_SIZE = 1 << 16
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
WorldSize = Annotated[int, msgspec.Meta(ge=2, le=MAX_WORLD_SIZE)]  # the trainer and one server at least
Rank = Annotated[int, msgspec.Meta(ge=1, lt=MAX_WORLD_SIZE)]  # a server's: rank 0 is the trainer's


class InitWeightGroup(msgspec.Struct, frozen=True, tag="init_weight_group"):
    """Joins the trainer's torch.distributed group (the trainer is rank 0 and broadcasts), at rank
    `rank_offset` (below `world_size`); answers once every rank has joined, or with an Error after
    --weight-group-join-timeout-s."""

    master_address: Annotated[str, msgspec.Meta(min_length=1)]
    master_port: Port
    rank_offset: Rank
    world_size: WorldSize
    group_name: str = "weight_update_group"
    backend: Literal["nccl", "gloo"] = "nccl"


class DestroyWeightGroup(msgspec.Struct, frozen=True, tag="destroy_weight_group"):
    group_name: str = "weight_update_group"


class UpdateFromDistributed(msgspec.Struct, frozen=True, tag="update_from_distributed"):
    """The trainer broadcasts from rank 0 the tensors named here, in this order, over the group.
    `load_format` "flattened_bucket": one broadcast of every tensor's bytes packed end to end, in
    order (dtypes mixed, as SGLang's FlattenedTensorBucket), rather than one broadcast per tensor."""

    names: list[str]
    dtypes: list[str]  # "bfloat16", "float32"... (a "torch." prefix is accepted)
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    load_format: str | None = None
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True
    pause_mode: UpdatePause | None = None
    checksums: list[str] = []  # optional, one per name: gpu/weight_check.py's checksum of the tensor


class UpdateFromTensor(msgspec.Struct, frozen=True, tag="update_from_tensor"):
    """Tensors a colocated trainer shares by CUDA IPC: SGLang's `serialized_named_tensors`, each a
    pickle of `[(name, tensor), ...]` or of a flattened bucket, opened by an unpickler that admits
    only torch's tensor-rebuild functions (gpu/ipc_tensors.py)."""

    serialized_named_tensors: list[bytes]
    load_format: str | None = None
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True
    pause_mode: UpdatePause | None = None


class TensorManifest(msgspec.Struct, frozen=True):
    name: str
    dtype: str
    shape: list[int]
    checksum: str  # gpu/weight_check.py's: every chunk is checked against it once the tensor is whole


class BeginBusUpload(msgspec.Struct, frozen=True, tag="begin_bus_upload"):
    """Starts (or, with the same `upload_id`, resumes) an upload of tensors over the bus by a
    trainer with no NCCL path; the reply says which chunks are still missing."""

    upload_id: str
    tensors: list[TensorManifest]
    chunk_bytes: int


class UploadChunk(msgspec.Struct, frozen=True, tag="upload_chunk"):
    upload_id: str
    tensor: int  # index into the manifest
    chunk: int  # index of the chunk within the tensor's bytes
    data: bytes


class FinishBusUpload(msgspec.Struct, frozen=True, tag="finish_bus_upload"):
    """Applies a complete upload as one update."""

    upload_id: str
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True
    pause_mode: UpdatePause | None = None


class UploadState(msgspec.Struct, frozen=True, tag="upload_state"):
    upload_id: str
    missing: dict[int, list[int]]  # tensor index -> chunk indices not received (or failed their check)


class UpdateWeightVersion(msgspec.Struct, frozen=True, tag="update_weight_version"):
    """Renames the serving weights' version, weights unchanged."""

    new_version: str
    abort_all_requests: bool = True


class GetWeightVersion(msgspec.Struct, frozen=True, tag="get_weight_version"):
    pass


class GetWeightsByName(msgspec.Struct, frozen=True, tag="get_weights_by_name"):
    name: str  # a checkpoint name, "model.layers.0.self_attn.q_proj.weight"
    truncate_size: int = 100


class WeightValues(msgspec.Struct, frozen=True, tag="weight_values"):
    name: str
    shape: list[int]
    dtype: str
    values: list[float]  # the first `truncate_size` of each row's values (SGLang's shape of an answer)
    checksum: str  # of the whole tensor as served, comparable to the trainer's


class WeightsUpdated(msgspec.Struct, frozen=True, tag="weights_updated"):
    """SGLang's answer (`success`, `message`, `num_paused_requests`), with what was loaded."""

    success: bool
    message: str
    weight_version: str
    num_paused_requests: int = 0  # requests in flight that the update paused
    tensors: int = 0
    bytes: int = 0
    pause_s: float = 0.0  # from the pause of generation to its resumption (0 when it was paused before)
    load_s: float = 0.0  # of which loading and validating in the executor


class GroupState(msgspec.Struct, frozen=True, tag="group_state"):
    success: bool
    message: str


class WeightVersion(msgspec.Struct, frozen=True, tag="weight_version"):
    weight_version: str
    # The checkpoint directory last loaded by UpdateFromDisk (SGLang's /get_model_info reports it);
    # None until one was: the served model's. Only weight_sync answers it; the executor leaves it None.
    model_path: str | None = None


# What the weight_sync actor answers on `<ns>.admin.weights`.
WeightsRequest = (
    UpdateFromDisk
    | InitWeightGroup
    | DestroyWeightGroup
    | UpdateFromDistributed
    | UpdateFromTensor
    | BeginBusUpload
    | UploadChunk
    | FinishBusUpload
    | UpdateWeightVersion
    | GetWeightVersion
    | GetWeightsByName
    | ReleaseMemory
    | ResumeMemory
    | GetMemory
)
WeightsReply = WeightsUpdated | GroupState | UploadState | WeightVersion | WeightValues | MemoryState
