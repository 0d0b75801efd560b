"""A remote trainer's side of an upload of weights over the bus (no NCCL path to the server), with
plain nats-py: the manifest, the chunks, and the resume after a bus outage.

    nc = await connect(url, ".kernel/bus/client.json")  # with --admin-key: .kernel/bus/admin.json
    updated = await upload_weights(nc, "step-100", dict(model.state_dict()), weight_version="100")

The server stages the chunks on disk under the upload id, so whatever is lost in an outage (or sent
while the server's weight_sync actor restarts) is simply sent again: `begin` answers which chunks
are still missing, and so does every chunk's reply. A tensor whose checksum fails is missing whole.
"""

import asyncio

import msgspec
import nats.errors
import torch

from gpu.weight_check import checksum
from schemas.admin_weights import (
    BeginBusUpload,
    FinishBusUpload,
    TensorManifest,
    UploadChunk,
    UploadState,
    WeightsUpdated,
)
from schemas.errors import Error

SUBJECT = "llm.admin.weights"
CHUNK_BYTES = 512 * 1024  # half of nats-server's default max_payload
REQUEST_TIMEOUT_S = 10.0
FINISH_TIMEOUT_S = 900.0


def manifest(upload_id: str, tensors: dict[str, torch.Tensor], chunk_bytes: int = CHUNK_BYTES) -> BeginBusUpload:
    entries = [
        TensorManifest(name, str(t.dtype).removeprefix("torch."), list(t.shape), checksum(t))
        for name, t in tensors.items()
    ]
    return BeginBusUpload(upload_id, entries, chunk_bytes)


def chunk_of(tensors: list[torch.Tensor], chunk_bytes: int, tensor: int, chunk: int) -> bytes:
    data = tensors[tensor].detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return data[chunk * chunk_bytes : (chunk + 1) * chunk_bytes].tobytes()


async def request(nc, message: BeginBusUpload | UploadChunk) -> UploadState | Error:
    """Asked again while the bus is down or the reply is lost: a begin or a chunk is idempotent."""
    while True:
        try:
            reply = await nc.request(SUBJECT, msgspec.msgpack.encode(message), timeout=REQUEST_TIMEOUT_S)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError):
            await asyncio.sleep(0.2)
            continue
        return msgspec.msgpack.decode(reply.data, type=UploadState | Error)


async def send_missing(nc, begin: BeginBusUpload, tensors: list[torch.Tensor]) -> None:
    """Sends every chunk the server lacks until it lacks none; raises on an Error."""
    while True:
        state = await request(nc, begin)
        if isinstance(state, Error):
            raise RuntimeError(f"{state.code}: {state.message}")
        if not state.missing:
            return
        for tensor, chunks in state.missing.items():
            for chunk in chunks:
                data = chunk_of(tensors, begin.chunk_bytes, tensor, chunk)
                reply = await request(nc, UploadChunk(begin.upload_id, tensor, chunk, data))
                if isinstance(reply, Error):
                    raise RuntimeError(f"{reply.code}: {reply.message}")


async def upload_weights(
    nc, upload_id: str, tensors: dict[str, torch.Tensor], chunk_bytes: int = CHUNK_BYTES, **finish_options
) -> WeightsUpdated | Error:
    """Uploads `tensors` (a whole checkpoint of the served model) and applies them as one update;
    `finish_options`: FinishBusUpload's (weight_version, flush_cache, pause_mode...)."""
    begin = manifest(upload_id, tensors, chunk_bytes)
    await send_missing(nc, begin, list(tensors.values()))
    return await finish(nc, FinishBusUpload(upload_id, **finish_options))


async def finish(nc, message: FinishBusUpload) -> WeightsUpdated | Error:
    """Asked once: an update is no request to repeat blindly (the version read after a lost reply
    tells whether it committed)."""
    reply = await nc.request(SUBJECT, msgspec.msgpack.encode(message), timeout=FINISH_TIMEOUT_S)
    return msgspec.msgpack.decode(reply.data, type=WeightsUpdated | Error)
