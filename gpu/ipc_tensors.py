"""Opens `update_weights_from_tensor` payloads: SGLang's `serialized_named_tensors`, pickles that a
colocated trainer made with torch's ForkingPickler, whose tensors are CUDA IPC handles to the
trainer's own device memory (the bytes never travel: the server copies them device to device).

A pickle can call anything it names, so these are opened by a restricted unpickler: it admits
only torch's tensor-rebuild functions and the few classes and values their arguments need, lets a
pickle call only those functions, and refuses any other name with a WeightError naming it. A
payload is one of SGLang's two forms: a list of `(name, tensor)` pairs, or (load_format
"flattened_bucket") a dict of one uint8 `flattened_tensor` and the `metadata` of the tensors
packed in it end to end. A CUDA tensor's device is an index or, as SGLang's patched reductions
send it (so that processes seeing different devices agree), the device's UUID.

On a CPU server (tests, no GPU) the admitted rebuilds are those of CPU shared memory instead.
"""

import io
import math
import pickle
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from multiprocessing.resource_sharer import DupFd

import torch
from torch.multiprocessing import reductions

from gpu.live_weights import TensorSpec
from gpu.weight_check import WeightError

_DEVICE_ARG = 6  # of rebuild_cuda_tensor's arguments (SGLang's patch puts the UUID there too)


@dataclass
class FlattenedTensorMetadata:
    """Where one tensor lies in a flattened bucket: SGLang's class of the same name and fields."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int  # its bytes in the bucket: [start_idx, end_idx)
    end_idx: int
    numel: int

    def __setstate__(self, state) -> None:
        """Unpickling: only this class's own fields."""
        if not isinstance(state, dict) or set(state) - set(self.__dataclass_fields__):
            raise WeightError("a bucket's metadata holds fields other than SGLang's")
        self.__dict__.update(state)


def _rebuild_cuda_tensor(*args):
    if len(args) != 15:
        raise WeightError(f"a CUDA tensor comes with 15 rebuild arguments, not {len(args)}")
    tensor_cls, storage_cls, device = args[0], args[4], args[_DEVICE_ARG]
    if tensor_cls not in (torch.Tensor, torch.nn.Parameter) or storage_cls not in _STORAGES:
        raise WeightError("a CUDA tensor's rebuild names a class that is no tensor or storage")
    return reductions.rebuild_cuda_tensor(*args[:_DEVICE_ARG], _device_index(device), *args[_DEVICE_ARG + 1 :])


def _device_index(device) -> int:
    if isinstance(device, int) and 0 <= device < torch.cuda.device_count():
        return device
    if isinstance(device, str):
        for index in range(torch.cuda.device_count()):
            if str(torch.cuda.get_device_properties(index).uuid) == device:
                return index
    raise WeightError(f"the tensors are on device {device!r}, which this server does not see")


def _rebuild_cpu_tensor(cls, storage, metadata):
    if cls not in (torch.Tensor, torch.nn.Parameter):
        raise WeightError("a tensor's rebuild names a class that is no tensor")
    return reductions.rebuild_tensor(cls, storage, metadata)


_STORAGES = (torch.UntypedStorage, torch.storage.TypedStorage)
_SAFE_VALUES = {  # classes a pickle may name as arguments, but not call
    ("torch", "Tensor"): torch.Tensor,
    ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
    ("torch.storage", "UntypedStorage"): torch.UntypedStorage,
    ("torch", "UntypedStorage"): torch.UntypedStorage,
    ("torch.storage", "TypedStorage"): torch.storage.TypedStorage,
}
_METADATA = {
    ("gpu.ipc_tensors", "FlattenedTensorMetadata"): FlattenedTensorMetadata,
    ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"): FlattenedTensorMetadata,
}
_REBUILD_CUDA = "torch.multiprocessing.reductions", "rebuild_cuda_tensor"
_CUDA_CALLS = {
    _REBUILD_CUDA: _rebuild_cuda_tensor,
    ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"): _rebuild_cuda_tensor,
    ("sglang.srt.patch_torch", "_rebuild_cuda_tensor_modified"): _rebuild_cuda_tensor,
    ("torch", "Size"): torch.Size,
}
_CPU_CALLS = {
    ("torch.multiprocessing.reductions", "rebuild_tensor"): _rebuild_cpu_tensor,
    ("torch.multiprocessing.reductions", "rebuild_typed_storage"): reductions.rebuild_typed_storage,
    ("torch.multiprocessing.reductions", "rebuild_storage_fd"): reductions.rebuild_storage_fd,
    ("torch.multiprocessing.reductions", "rebuild_storage_empty"): reductions.rebuild_storage_empty,
    ("torch", "Size"): torch.Size,
}
_CPU_OBJECTS = {("multiprocessing.resource_sharer", "DupFd"): DupFd}  # a shared memory file's descriptor


class _TensorUnpickler(pickle._Unpickler):
    """The pure-Python unpickler, whose opcodes can be checked one by one: a call (REDUCE) only of
    an admitted function, an object made (NEWOBJ) only of an admitted class, and state set
    (BUILD) only on those objects."""

    def __init__(self, data: bytes, device: torch.device) -> None:
        super().__init__(io.BytesIO(data))
        on_cuda = device.type == "cuda"
        self._calls = _CUDA_CALLS if on_cuda else _CPU_CALLS
        self._objects = _METADATA if on_cuda else _METADATA | _CPU_OBJECTS
        self.dispatch = dict(pickle._Unpickler.dispatch)
        self.dispatch[pickle.REDUCE[0]] = _TensorUnpickler._reduce
        self.dispatch[pickle.NEWOBJ[0]] = _TensorUnpickler._newobj
        self.dispatch[pickle.BUILD[0]] = _TensorUnpickler._build
        for opcode in (pickle.NEWOBJ_EX, pickle.OBJ, pickle.INST, pickle.EXT1, pickle.EXT2, pickle.EXT4):
            self.dispatch[opcode[0]] = _TensorUnpickler._refuse

    def find_class(self, module: str, name: str):
        key = module, name
        found = self._calls.get(key) or self._objects.get(key) or _SAFE_VALUES.get(key)
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        if found is None:
            where = " (CUDA tensors on a CPU server?)" if key == _REBUILD_CUDA else ""
            raise WeightError(f"the payload names {module}.{name}, which is no tensor rebuild{where}")
        return found

    def _reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if func not in self._calls.values() or not isinstance(args, tuple):
            raise WeightError(f"the payload calls {getattr(func, '__name__', type(func).__name__)}, no tensor rebuild")
        self.stack[-1] = func(*args)

    def _newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if cls not in self._objects.values():
            raise WeightError(f"the payload makes a {getattr(cls, '__name__', cls)}, no tensor metadata")
        self.append(cls.__new__(cls, *args))

    def _build(self) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if type(target) not in self._objects.values():
            raise WeightError(f"the payload sets the state of a {type(target).__name__}")
        if isinstance(target, FlattenedTensorMetadata):
            target.__setstate__(state)
        elif isinstance(state, dict) and set(state) == {"_id"}:  # a DupFd: the sharer's address and key
            target.__dict__.update(state)
        else:
            raise WeightError("the payload sets a shared file's handle to something else")

    def _refuse(self) -> None:
        raise WeightError("the payload uses a pickle opcode that tensors never need")


def open_payload(data: bytes, flattened: bool, device: torch.device) -> list[tuple[TensorSpec, torch.Tensor]]:
    """The named tensors of one payload (the trainer's memory, mapped; not copied), each with the
    spec it claims; WeightError for anything else."""
    try:
        opened = _TensorUnpickler(data, device).load()
    except WeightError:
        raise
    except Exception as exc:  # a truncated or corrupt pickle, a handle that does not open
        raise WeightError(f"the payload is not a pickle of shared tensors: {type(exc).__name__}: {exc}") from None
    return _bucket_tensors(opened) if flattened else _named_tensors(opened)


def _named_tensors(opened) -> list[tuple[TensorSpec, torch.Tensor]]:
    pairs = opened if isinstance(opened, list) else None
    if pairs is None or not all(
        isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], torch.Tensor) for p in pairs
    ):
        raise WeightError("a payload must be a list of (name, tensor) pairs (or a flattened bucket, so marked)")
    return [(TensorSpec(name, t.dtype, tuple(t.shape)), t) for name, t in pairs]


def _bucket_tensors(opened) -> list[tuple[TensorSpec, torch.Tensor]]:
    """The tensors of SGLang's flattened bucket: views of its bytes (copies where misaligned)."""
    bucket = opened.get("flattened_tensor") if isinstance(opened, dict) else None
    entries = opened.get("metadata") if isinstance(opened, dict) else None
    if not isinstance(bucket, torch.Tensor) or bucket.dtype != torch.uint8 or bucket.dim() != 1:
        raise WeightError("a flattened payload must hold a flattened_tensor of bytes (1-d uint8)")
    if not isinstance(entries, list) or not all(isinstance(e, FlattenedTensorMetadata) for e in entries):
        raise WeightError("a flattened payload must hold a metadata list of FlattenedTensorMetadata")
    tensors = []
    for entry in entries:
        spec = _entry_spec(entry, bucket.numel())
        raw = bucket[entry.start_idx : entry.end_idx]
        if raw.data_ptr() % spec.dtype.itemsize:
            raw = raw.clone()
        tensors.append((spec, raw.view(spec.dtype).view(spec.shape)))
    return tensors


def _entry_spec(entry: FlattenedTensorMetadata, bucket_bytes: int) -> TensorSpec:
    fields = (entry.__dict__.get(f) for f in ("name", "shape", "dtype", "start_idx", "end_idx"))
    name, shape, dtype, start, end = fields
    if not (isinstance(name, str) and isinstance(dtype, torch.dtype) and isinstance(shape, tuple)):
        raise WeightError("a bucket's metadata entry lacks a name, a dtype or a shape")
    if not all(isinstance(n, int) and n >= 0 for n in (*shape, start, end)) or not start <= end <= bucket_bytes:
        raise WeightError(f"{name}: its bytes [{start}, {end}) are not within the bucket's {bucket_bytes}")
    if end - start != math.prod(shape) * dtype.itemsize:
        raise WeightError(f"{name}: {end - start} bytes in the bucket do not hold {dtype} {list(shape)}")
    return TensorSpec(name, dtype, tuple(shape))


class _SharingPickler(ForkingPickler):
    """ForkingPickler naming each CUDA tensor's device by UUID, as SGLang's patched reductions do."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.is_cuda:
            rebuild, args = reductions.reduce_tensor(obj)
            uuid = str(torch.cuda.get_device_properties(obj.device).uuid)
            return rebuild, (*args[:_DEVICE_ARG], uuid, *args[_DEVICE_ARG + 1 :])
        return NotImplemented


def ipc_payload(named: list[tuple[str, torch.Tensor]], flattened: bool) -> bytes:
    """A `serialized_named_tensors` entry for these tensors, which must stay alive (and unchanged)
    until the server has answered: it reads them in place."""
    if flattened:
        parts, entries, offset = [], [], 0
        for name, tensor in named:
            raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            entries.append(
                FlattenedTensorMetadata(name, tensor.shape, tensor.dtype, offset, offset + raw.numel(), raw.numel())
            )
            parts.append(raw)
            offset += raw.numel()
        obj = {"flattened_tensor": torch.cat(parts), "metadata": entries}
    else:
        obj = [(name, tensor.detach()) for name, tensor in named]
    buffer = io.BytesIO()
    _SharingPickler(buffer).dump(obj)
    return buffer.getvalue()
