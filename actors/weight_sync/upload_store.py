"""Weights uploaded over the bus by a trainer with no NCCL path, staged on disk until complete.

An upload is a manifest (each tensor's name, dtype, shape and checksum) and chunks of each tensor's
bytes. They are written straight into their place in one safetensors file, so a finished upload is
a checkpoint directory the executor loads like any other (`DiskSource`). Which chunks arrived is
logged beside it, so after a bus outage, or a restart of this actor, the trainer asks again with
the same upload id and sends only what is missing. When a tensor's last chunk arrives its checksum
(gpu/weight_check.py's, the function the trainer computed, here on the CPU) is checked; a tensor
that fails is missing whole again.

Layout of `<root>/<upload_id>/`: `begin.msgpack` (the manifest), `model.safetensors`, and
`received.log` (8 bytes per chunk written: tensor and chunk index) and `verified.log` (4 bytes per
tensor checked), both append-only.
"""

import json
import math
import mmap
import os
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import structlog

from schemas.admin_weights import BeginBusUpload, UploadChunk, UploadState
from schemas.errors import Error

# dtype name -> (safetensors' code, bytes per element)
DTYPES = {
    "float64": ("F64", 8),
    "float32": ("F32", 4),
    "bfloat16": ("BF16", 2),
    "float16": ("F16", 2),
    "float8_e4m3fn": ("F8_E4M3", 1),
    "float8_e5m2": ("F8_E5M2", 1),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}
UPLOAD_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a directory name
CHECKPOINT = "model.safetensors"
log = structlog.get_logger()


@dataclass
class Upload:
    folder: Path
    manifest: BeginBusUpload
    offsets: list[int]  # of each tensor's bytes in the checkpoint file
    sizes: list[int]  # each tensor's bytes
    received: list[set[int]] = field(default_factory=list)  # per tensor, the chunks written
    verified: set[int] = field(default_factory=set)  # tensors whole and matching their checksum

    def chunks(self, tensor: int) -> int:
        return math.ceil(self.sizes[tensor] / self.manifest.chunk_bytes)

    def missing(self, tensor: int) -> list[int]:
        if tensor in self.verified:
            return []
        return [c for c in range(self.chunks(tensor)) if c not in self.received[tensor]]

    def state(self) -> UploadState:
        missing = {t: m for t in range(len(self.sizes)) if (m := self.missing(t))}
        return UploadState(self.manifest.upload_id, missing)


class UploadStore:
    """Uploads by id, under `root`; `max_chunk_bytes`: what one bus message can carry."""

    def __init__(self, root: Path, max_chunk_bytes: int) -> None:
        self.root = root
        self.max_chunk_bytes = max_chunk_bytes
        self._open: dict[str, Upload] = {}

    def begin(self, message: BeginBusUpload) -> UploadState | Error:
        """Starts an upload, or resumes the one of that id (the same manifest); says what is missing."""
        if error := self._check(message):
            return error
        upload = self._find(message.upload_id)
        if upload is not None:
            if upload.manifest != message:
                return Error(
                    "invalid_request",
                    f"upload {message.upload_id!r} was begun with another manifest; use a new upload_id",
                    param="upload_id",
                )
            return upload.state()
        upload = self._create(message)
        for tensor in range(len(upload.sizes)):
            if upload.sizes[tensor] == 0:
                self._verify(upload, tensor)
        return upload.state()

    def write(self, message: UploadChunk) -> UploadState | Error:
        """Writes a chunk in its place; when it completes its tensor, checks the tensor. Answers the
        chunks of that tensor still missing (all of them after a failed check)."""
        upload = self._find(message.upload_id)
        if upload is None:
            return Error("not_found", f"no upload {message.upload_id!r}: begin it first", param="upload_id")
        tensor, chunk = message.tensor, message.chunk
        if not 0 <= tensor < len(upload.sizes):
            return Error("invalid_request", f"tensor {tensor} is not in the manifest", param="tensor")
        if not 0 <= chunk < upload.chunks(tensor):
            return Error("invalid_request", f"tensor {tensor} has no chunk {chunk}", param="chunk")
        start = chunk * upload.manifest.chunk_bytes
        expected = min(upload.manifest.chunk_bytes, upload.sizes[tensor] - start)
        if len(message.data) != expected:
            return Error(
                "invalid_request",
                f"chunk {chunk} of tensor {tensor} must be {expected} bytes, not {len(message.data)}",
                param="data",
            )
        if tensor not in upload.verified:
            fd = os.open(upload.folder / CHECKPOINT, os.O_WRONLY)
            try:
                os.pwrite(fd, message.data, upload.offsets[tensor] + start)
            finally:
                os.close(fd)
            _append(upload.folder / "received.log", struct.pack("<II", tensor, chunk))
            upload.received[tensor].add(chunk)
            if len(upload.received[tensor]) == upload.chunks(tensor):
                self._verify(upload, tensor)
        return UploadState(upload.manifest.upload_id, {tensor: upload.missing(tensor)})

    def checkpoint(self, upload_id: str) -> Path | Error:
        """The directory of a complete upload, to load; an Error saying what is missing otherwise."""
        upload = self._find(upload_id)
        if upload is None:
            return Error("not_found", f"no upload {upload_id!r}", param="upload_id")
        missing = upload.state().missing
        if missing:
            names = [upload.manifest.tensors[t].name for t in sorted(missing)][:5]
            return Error(
                "invalid_request",
                f"upload {upload_id!r} is not complete: {len(missing)} tensors lack chunks or failed their "
                f"checksum ({', '.join(names)}{', ...' if len(missing) > 5 else ''})",
                param="upload_id",
            )
        return upload.folder

    def remove(self, upload_id: str) -> None:
        self._open.pop(upload_id, None)
        shutil.rmtree(self.root / upload_id, ignore_errors=True)

    def _check(self, message: BeginBusUpload) -> Error | None:
        if not UPLOAD_ID.match(message.upload_id):
            return Error("invalid_request", "upload_id must be 1 to 64 letters, digits, _ or -", param="upload_id")
        if not 0 < message.chunk_bytes <= self.max_chunk_bytes:
            return Error(
                "invalid_request",
                f"chunk_bytes must be from 1 to {self.max_chunk_bytes} (what one bus message carries)",
                param="chunk_bytes",
            )
        if not message.tensors:
            return Error("invalid_request", "an upload needs at least one tensor", param="tensors")
        names = set()
        for i, tensor in enumerate(message.tensors):
            if tensor.dtype.removeprefix("torch.") not in DTYPES:
                return Error(
                    "invalid_request", f"unknown dtype {tensor.dtype!r} of {tensor.name}", param=f"tensors[{i}].dtype"
                )
            if any(d < 0 for d in tensor.shape):
                return Error("invalid_request", f"negative dimension in {tensor.name}", param=f"tensors[{i}].shape")
            if not tensor.name or tensor.name in names:
                return Error("invalid_request", f"empty or repeated name {tensor.name!r}", param=f"tensors[{i}].name")
            names.add(tensor.name)
        return None

    def _find(self, upload_id: str) -> Upload | None:
        """The upload in memory, or read back from its folder (after a restart of this actor)."""
        if upload_id in self._open or not UPLOAD_ID.match(upload_id):
            return self._open.get(upload_id)
        folder = self.root / upload_id
        try:
            manifest = msgspec.msgpack.decode((folder / "begin.msgpack").read_bytes(), type=BeginBusUpload)
        except (OSError, msgspec.DecodeError):
            return None  # none, or one whose begin never finished writing: begun again from scratch
        upload = self._layout(folder, manifest)
        for tensor, chunk in _records(folder / "received.log", "<II"):
            upload.received[tensor].add(chunk)
        upload.verified = {tensor for (tensor,) in _records(folder / "verified.log", "<I")}
        for tensor in range(len(upload.sizes)):
            if tensor not in upload.verified and len(upload.received[tensor]) == upload.chunks(tensor):
                self._verify(upload, tensor)  # its last chunk came just before the restart
        self._open[upload_id] = upload
        return upload

    def _create(self, message: BeginBusUpload) -> Upload:
        folder = self.root / message.upload_id
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        upload = self._layout(folder, message)
        header = _header(message, upload.sizes)
        with open(folder / CHECKPOINT, "wb") as f:
            f.write(header)
            f.truncate(len(header) + sum(upload.sizes))
        # The manifest goes last: an upload whose folder has it is whole on disk.
        (folder / "begin.msgpack").write_bytes(msgspec.msgpack.encode(message))
        self._open[message.upload_id] = upload
        return upload

    @staticmethod
    def _layout(folder: Path, manifest: BeginBusUpload) -> Upload:
        sizes = [math.prod(t.shape) * DTYPES[t.dtype.removeprefix("torch.")][1] for t in manifest.tensors]
        data_start = len(_header(manifest, sizes))
        offsets = [data_start + sum(sizes[:i]) for i in range(len(sizes))]
        return Upload(folder, manifest, offsets, sizes, [set() for _ in sizes])

    def _verify(self, upload: Upload, tensor: int) -> None:
        """Checks a whole tensor's bytes against the trainer's checksum; on a mismatch every chunk
        of it is missing again."""
        # Imported here, by the first upload to finish a tensor: torch takes seconds to import, and
        # most servers never see a bus upload, so the actor starts without it.
        import torch

        from gpu.weight_check import checksum

        size, expected = upload.sizes[tensor], upload.manifest.tensors[tensor].checksum.lower()
        with open(upload.folder / CHECKPOINT, "rb") as f:
            if size == 0:
                got = checksum(torch.empty(0, dtype=torch.uint8))
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as view:
                    got = checksum(torch.frombuffer(view, dtype=torch.uint8, count=size, offset=upload.offsets[tensor]))
        if got == expected:
            upload.verified.add(tensor)
            _append(upload.folder / "verified.log", struct.pack("<I", tensor))
        else:
            log.warning(
                "weight_check_failed", upload_id=upload.manifest.upload_id, tensor=upload.manifest.tensors[tensor].name
            )
            upload.received[tensor].clear()
            # The log keeps the old records: a restart would count them again, so they are redone.
            _rewrite_received(upload)


def _header(manifest: BeginBusUpload, sizes: list[int]) -> bytes:
    """safetensors' header of the upload's tensors, in manifest order: its length (8 bytes,
    little-endian), then JSON padded to 8 bytes."""
    header, offset = {}, 0
    for tensor, size in zip(manifest.tensors, sizes, strict=True):
        code = DTYPES[tensor.dtype.removeprefix("torch.")][0]
        header[tensor.name] = {"dtype": code, "shape": tensor.shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _append(path: Path, record: bytes) -> None:
    with open(path, "ab") as f:
        f.write(record)


def _records(path: Path, layout: str) -> list[tuple[int, ...]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    size = struct.calcsize(layout)
    return [struct.unpack_from(layout, data, i) for i in range(0, len(data) - len(data) % size, size)]


def _rewrite_received(upload: Upload) -> None:
    records = b"".join(struct.pack("<II", t, c) for t, chunks in enumerate(upload.received) for c in sorted(chunks))
    partial = upload.folder / "received.log.partial"
    partial.write_bytes(records)
    os.replace(partial, upload.folder / "received.log")
