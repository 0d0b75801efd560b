"""SGLang's live-weight request bodies, decoded into the weight_sync actor's messages
(schemas/admin_weights.py) or an `Error` naming the field at fault. No I/O.

Each body has the fields and defaults of SGLang's io_struct.py (`UpdateWeightFromDiskReqInput`,
`UpdateWeightsFromDistributedReqInput`, `UpdateWeightsFromTensorReqInput`,
`InitWeightsUpdateGroupReqInput`, `DestroyWeightsUpdateGroupReqInput`,
`UpdateWeightVersionReqInput`, `GetWeightsByNameReqInput`, `Release`/`ResumeMemoryOccupationReqInput`),
so an RL client's request decodes unchanged. The rule of every body (request_fields.py) holds:
SGLang's switches that change nothing here (`torch_empty_cache`, `recapture_cuda_graph`, `token_step`,
`disable_draft_model`) are accepted with no effect, each saying why; those asking for a behaviour
this server lacks (`is_async`, `keep_pause`, `manifest`) are taken only as their no-op value
(false, null), and any unknown field gets a 400 rather than being dropped silently. Beyond SGLang's: `pause_mode` on every update (what
happens to requests in flight, schemas/admin_weights.py's `UpdatePause`) and `checksums` on a distributed
one (one per tensor, checked before it is written).
"""

from typing import Annotated, Literal, TypeVar

import msgspec

from actors.frontdoor.request_fields import beyond_schema, decode_body, invalid
from schemas.admin_weights import (
    DestroyWeightGroup,
    GetWeightsByName,
    InitWeightGroup,
    Port,
    Rank,
    UpdateFromDisk,
    UpdateFromDistributed,
    UpdateFromTensor,
    UpdatePause,
    UpdateWeightVersion,
    WorldSize,
)
from schemas.errors import Error
from schemas.sleep import MemoryTag, ReleaseMemory, ResumeMemory

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
# A port number, 1 to 65535, written in ASCII digits (leading zeros allowed).
PortDigits = Annotated[
    str,
    msgspec.Meta(pattern=r"^0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$"),
]
BucketFormat = Literal["direct", "flattened_bucket"]  # a list of (name, tensor) pairs, or one packed bucket
PER_TENSOR = "one entry per name"
Dim = Annotated[int, msgspec.Meta(ge=0)]
GROUP_NAME = "weight_update_group"  # SGLang's default
# The old single-tensor body of /update_weights_from_distributed, and what replaced each field.
SINGULAR = {"name": "names", "dtype": "dtypes", "shape": "shapes"}


class Body(msgspec.Struct, forbid_unknown_fields=True):
    pass


class _Update(Body):
    """What every update shares: SGLang's fields, and ours (`pause_mode`)."""

    weight_version: NonEmpty | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True
    pause_mode: UpdatePause | None = None
    torch_empty_cache: bool = False  # SGLang's; the executor's memory is its own business here


class DiskBody(_Update, kw_only=True):
    model_path: Annotated[NonEmpty, beyond_schema("a checkpoint directory on the server, of the served architecture")]
    load_format: Literal["auto", "safetensors"] | None = None
    recapture_cuda_graph: bool = False  # SGLang's: graphs read the weights in place, so stay valid
    token_step: int = 0  # SGLang's trainer step, for its own metrics
    is_async: Literal[False] = False  # request_fields.NOT_IMPLEMENTED says what to do instead
    keep_pause: Literal[False] = False
    manifest: None = None


class DistributedBody(_Update, kw_only=True):
    names: Annotated[list[NonEmpty], msgspec.Meta(min_length=1), beyond_schema("tensors of the served model")]
    # "bfloat16", as slime and AReaL send them ("torch.bfloat16" is accepted)
    dtypes: Annotated[list[NonEmpty], beyond_schema(PER_TENSOR + ", a torch dtype")]
    shapes: Annotated[list[list[Dim]], beyond_schema(PER_TENSOR)]
    group_name: Annotated[NonEmpty, beyond_schema("a group joined by /init_weights_update_group")] = GROUP_NAME
    checksums: Annotated[list[str], beyond_schema(PER_TENSOR + ", or none")] = []
    load_format: BucketFormat | None = None


class TensorBody(_Update, kw_only=True):
    # base64 in JSON, as SGLang's HTTP callers send them
    serialized_named_tensors: Annotated[
        list[bytes], msgspec.Meta(min_length=1), beyond_schema("SGLang's serialized tensors, shared by CUDA IPC")
    ]
    load_format: BucketFormat | None = None
    disable_draft_model: bool | None = None  # SGLang's; there is no draft model


class InitGroupBody(Body):
    master_address: NonEmpty
    master_port: Port | PortDigits  # AReaL sends a string
    rank_offset: Annotated[Rank, beyond_schema("below world_size: rank 0 is the trainer's")]
    world_size: WorldSize
    group_name: NonEmpty = GROUP_NAME
    backend: Annotated[Literal["nccl", "gloo"], beyond_schema("nccl needs the server on a CUDA device")] = "nccl"


class DestroyGroupBody(Body):
    group_name: Annotated[NonEmpty, beyond_schema("a group this server has joined")] = GROUP_NAME


class VersionBody(Body):
    new_version: NonEmpty
    abort_all_requests: bool = True


class WeightsByNameBody(Body):
    name: Annotated[NonEmpty, beyond_schema("a weight of the served checkpoint")]
    truncate_size: Annotated[int, msgspec.Meta(ge=1)] = 100


class MemoryBody(Body):
    tags: list[MemoryTag] | None = None  # None: every tag


M = TypeVar("M", bound=msgspec.Struct)


def carried(parsed: Body, message_type: type[M]) -> M:
    """The bus message of a decoded body: each of its fields from the body's field of that name (a
    body also holds SGLang's fields that change nothing here). By name, so no order can mix them."""
    return message_type(**{name: getattr(parsed, name) for name in message_type.__struct_fields__})


def parse_disk(body: bytes) -> UpdateFromDisk | Error:
    parsed = decode_body(body, DiskBody)
    if isinstance(parsed, Error):
        return parsed
    return carried(parsed, UpdateFromDisk)


def parse_distributed(body: bytes) -> UpdateFromDistributed | Error:
    parsed = decode_body(body, DistributedBody)
    if isinstance(parsed, Error):
        if parsed.param in SINGULAR:  # a field unknown here, and the old form of a known one
            fields = ", ".join(f"`{plural}`" for plural in SINGULAR.values())
            return invalid(
                f"`{parsed.param}` is the old single-tensor form: send {fields}, one entry per tensor",
                parsed.param,
            )
        return parsed
    for field, values in (("dtypes", parsed.dtypes), ("shapes", parsed.shapes), ("checksums", parsed.checksums)):
        if len(values) != len(parsed.names) and (values or field != "checksums"):
            return invalid(f"`{field}` has {len(values)} entries for {len(parsed.names)} names: one per tensor", field)
    return carried(parsed, UpdateFromDistributed)


def parse_tensor(body: bytes) -> UpdateFromTensor | Error:
    parsed = decode_body(body, TensorBody)
    if isinstance(parsed, Error):
        return parsed
    return carried(parsed, UpdateFromTensor)


def parse_init_group(body: bytes) -> InitWeightGroup | Error:
    parsed = decode_body(body, InitGroupBody)
    if isinstance(parsed, Error):
        return parsed
    port = parsed.master_port
    if isinstance(port, str):  # PortDigits, but Python's `$` also matches before a final newline
        if not (port.isascii() and port.isdigit()):
            return invalid(f"`master_port` must be a port number, not {port!r}", "master_port")
        port = int(port)
    if parsed.rank_offset >= parsed.world_size:
        message = f"`rank_offset` must be below world_size: rank 0 is the trainer's, not {parsed.rank_offset}"
        return invalid(message, "rank_offset")
    return InitWeightGroup(
        parsed.master_address, port, parsed.rank_offset, parsed.world_size, parsed.group_name, parsed.backend
    )


def parse_destroy_group(body: bytes) -> DestroyWeightGroup | Error:
    parsed = decode_body(body or b"{}", DestroyGroupBody)
    return parsed if isinstance(parsed, Error) else carried(parsed, DestroyWeightGroup)


def parse_version(body: bytes) -> UpdateWeightVersion | Error:
    parsed = decode_body(body, VersionBody)
    return parsed if isinstance(parsed, Error) else carried(parsed, UpdateWeightVersion)


def parse_weights_by_name(body: bytes) -> GetWeightsByName | Error:
    parsed = decode_body(body, WeightsByNameBody)
    return parsed if isinstance(parsed, Error) else carried(parsed, GetWeightsByName)


def parse_release(body: bytes) -> ReleaseMemory | Error:
    """`{}`, `{"tags": null}` or `{"tags": [...]}`; no body at all (a GET) is `{}`."""
    parsed = decode_body(body or b"{}", MemoryBody)
    return parsed if isinstance(parsed, Error) else carried(parsed, ReleaseMemory)


def parse_resume(body: bytes) -> ResumeMemory | Error:
    parsed = decode_body(body or b"{}", MemoryBody)
    return parsed if isinstance(parsed, Error) else carried(parsed, ResumeMemory)
