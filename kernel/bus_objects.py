"""A JetStream object bucket as actors use it: files by name, of any size, cut into chunks on the
wire and checked by their SHA-256 when read back. kernel/bus.py opens one (`Bus.object_bucket`);
what goes wrong comes back as `JetStreamError` (kernel/bus_jetstream.py), never as a nats exception.

Like a key-value bucket, it lives in the NATS server: every server of a namespace on that NATS,
on whichever machine, reads what another one put. Each object's name, size, description and the
order it was put in come from its meta message, read from the stream's own books.
"""

import asyncio
import base64
import hashlib
import json
from pathlib import Path
from typing import BinaryIO, NamedTuple

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.object_store import ObjectStore

from kernel.bus_jetstream import REQUEST_TIMEOUT_S, JetStreamError, api_call, jetstream_error, stream_subjects

# Bytes a chunk: within every server's max_payload (1 MiB by default) with room for the headers,
# and large enough that a put's one round trip per chunk costs little.
CHUNK_BYTES = 512 << 10


class StoredObject(NamedTuple):
    name: str
    size: int
    description: str
    sequence: int  # of its meta message in the stream: objects put later have higher ones


class ObjectMissing(JetStreamError):
    """The object is not in the bucket (never put, deleted, or its bytes dropped)."""


class ObjectBucket:
    """One bucket. Names are any text (JetStream encodes them in the subjects)."""

    def __init__(self, store: ObjectStore, name: str, nc: Client) -> None:
        self._store = store
        self.name = name
        self._nc = nc
        self._stream = f"OBJ_{name}"
        self._js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)

    async def put_file(self, name: str, path: Path, description: str = "") -> None:
        """Puts the file's bytes as object `name`, replacing any object of that name once whole.
        Raises `JetStreamError` if the bucket did not take them all (full, say): then none is kept."""
        chunk = min(CHUNK_BYTES, self._nc.max_payload - 4096)
        meta = api.ObjectMeta(name=name, description=description, options=api.ObjectMetaOptions(max_chunk_size=chunk))
        try:
            with open(path, "rb") as data:
                await self._store.put(name, data, meta)
        except (nats.errors.Error, TimeoutError) as exc:
            raise jetstream_error(f"cannot put {name!r} into object bucket {self.name}", exc) from None

    async def get_file(self, name: str, path: Path, timeout_s: float) -> None:
        """Writes object `name`'s bytes to `path`, checked against the SHA-256 it was put with.
        Raises `ObjectMissing` if there is no such object, `JetStreamError` if its bytes do not
        come back whole within `timeout_s` or fail the check. (nats-py's own `get` would leave its
        consumer behind when given up on.)"""
        try:
            async with asyncio.timeout(timeout_s):
                info = await self._store.get_info(name)
                with open(path, "wb") as out:
                    digest = await self._receive(info, out) if info.size else hashlib.sha256().digest()
        except nats.js.errors.ObjectNotFoundError:
            raise ObjectMissing(f"no object {name!r} in object bucket {self.name}") from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise jetstream_error(f"cannot get {name!r} from object bucket {self.name}", exc) from None
        if (info.digest or "").removeprefix("SHA-256=") != base64.urlsafe_b64encode(digest).decode():
            raise JetStreamError(f"object {name!r} of object bucket {self.name} fails its SHA-256")

    async def _receive(self, info: api.ObjectInfo, out: BinaryIO) -> bytes:
        """Writes the object's chunks to `out` as they come; returns their SHA-256."""
        subscription = await self._js.subscribe(f"$O.{self.name}.C.{info.nuid}", ordered_consumer=True)
        digest = hashlib.sha256()
        try:
            async for message in subscription.messages:
                await asyncio.to_thread(out.write, message.data)
                digest.update(message.data)
                if message.metadata.num_pending == 0:
                    return digest.digest()
        finally:
            await subscription.unsubscribe()
        raise JetStreamError(f"the chunks of object {info.name!r} stopped coming")

    async def objects(self) -> list[StoredObject]:
        """Every object the bucket holds, in the order they were put."""
        prefix, found = f"$O.{self.name}.M.", []
        what = f"list the objects of object bucket {self.name}"
        for subject in await stream_subjects(self._nc, self._stream, prefix, what):
            reply = await api_call(self._nc, f"STREAM.MSG.GET.{self._stream}", {"last_by_subj": subject}, what)
            message = reply.get("message") or {}
            try:
                info = json.loads(base64.b64decode(message.get("data") or ""))
            except ValueError:
                continue  # not a meta message this module reads: no object of ours
            if info.get("deleted") or not info.get("name"):
                continue
            found.append(StoredObject(info["name"], info.get("size", 0), info.get("description") or "", message["seq"]))
        return sorted(found, key=lambda stored: stored.sequence)

    async def delete(self, name: str) -> None:
        """Removes the object and its bytes, if it is there."""
        try:
            await self._store.delete(name)
        except nats.js.errors.ObjectNotFoundError:
            return
        except (nats.errors.Error, TimeoutError) as exc:
            raise jetstream_error(f"cannot delete {name!r} from object bucket {self.name}", exc) from None

    async def purge(self) -> None:
        """Removes every object."""
        await api_call(self._nc, f"STREAM.PURGE.{self._stream}", {}, f"purge object bucket {self.name}")


async def open_object_bucket(nc: Client, name: str, max_bytes: int) -> ObjectBucket:
    """The object bucket `name`, made if it does not exist yet, holding at most `max_bytes` (a put
    past it fails). Raises `JetStreamUnavailable` where the server has no JetStream."""
    js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
    try:
        try:
            store = await js.object_store(name)
        except nats.js.errors.BucketNotFoundError:
            # Two servers may make it at once: the second's identical request succeeds as well.
            store = await js.create_object_store(name, config=api.ObjectStoreConfig(max_bytes=max_bytes))
    except (nats.errors.Error, TimeoutError) as exc:
        raise jetstream_error(f"cannot open the object bucket {name}", exc) from None
    return ObjectBucket(store, name, nc)
