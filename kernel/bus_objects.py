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
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, NamedTuple

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.object_store import ObjectStore

from kernel.bus_jetstream import REQUEST_TIMEOUT_S, JetStreamError, api_call, jetstream_error, stream_subjects

# Bytes a chunk: within every server's max_payload (1 MiB by default) with room for the headers.
CHUNK_BYTES = 512 << 10
PUT_WINDOW = 16  # chunks a put has sent that the stream has not acknowledged yet


FETCH_CHUNKS = 32  # chunks a read asks for at once (16 MiB)
CONSUMER_IDLE_S = 10.0  # a read's consumer left behind (its reader gone) is deleted after this


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
        Raises `JetStreamError` if the bucket did not take them all (full, say): then none is kept.

        The chunks go out PUT_WINDOW at a time before their acknowledgements come back (nats-py's
        `put` waits for each, which held puts near 200 MB/s), in order, on one connection; the
        meta message that makes the object whole goes last, as nats-py writes it, so either
        reads what the other put."""
        chunk_bytes = min(CHUNK_BYTES, self._nc.max_payload - 4096)
        chunks = f"$O.{self.name}.C.{uuid.uuid4().hex}"  # new chunks never mix with an old object's
        try:
            try:
                replaced = await self._store.get_info(name)
            except nats.js.errors.ObjectNotFoundError:
                replaced = None
            digest, size, count = await self._send_chunks(path, chunks, chunk_bytes)
            info = api.ObjectInfo(
                name=name,
                bucket=self.name,
                nuid=chunks.rsplit(".", 1)[1],
                size=size,
                chunks=count,
                digest="SHA-256=" + base64.urlsafe_b64encode(digest).decode(),
                mtime=datetime.now(UTC).isoformat(),
                description=description,
                options=api.ObjectMetaOptions(max_chunk_size=chunk_bytes),
            )
            meta = json.dumps(info.as_dict()).encode()
            await self._js.publish(self._meta_subject(name), meta, headers={"Nats-Rollup": "sub"})
        except (nats.errors.Error, TimeoutError, JetStreamError) as exc:
            await self._purge(chunks)
            raise jetstream_error(f"cannot put {name!r} into object bucket {self.name}", exc) from None
        if replaced is not None and not replaced.deleted:
            await self._purge(f"$O.{self.name}.C.{replaced.nuid}")

    async def _send_chunks(self, path: Path, subject: str, chunk_bytes: int) -> tuple[bytes, int, int]:
        """Publishes the file in chunks on `subject`, each acknowledged by the stream; returns the
        SHA-256 of the bytes, their count and the chunks'."""
        inbox = self._nc.new_inbox()
        acknowledged: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_ack(message) -> None:
            await acknowledged.put(message.data)

        subscription = await self._nc.subscribe(f"{inbox}.*", cb=on_ack)
        digest, size, sent, answered, refused = hashlib.sha256(), 0, 0, 0, None
        try:
            with open(path, "rb") as data:
                while not refused and (chunk := await asyncio.to_thread(_read_and_hash, data, digest, chunk_bytes)):
                    await self._nc.publish(subject, chunk, reply=f"{inbox}.{sent}")
                    sent, size = sent + 1, size + len(chunk)
                    while sent - answered >= PUT_WINDOW:
                        refused = refused or _refusal(await asyncio.wait_for(acknowledged.get(), REQUEST_TIMEOUT_S))
                        answered += 1
            # Every chunk sent is answered before a refusal is raised, so the purge that follows
            # it finds every chunk the stream took.
            while answered < sent:
                refused = refused or _refusal(await asyncio.wait_for(acknowledged.get(), REQUEST_TIMEOUT_S))
                answered += 1
        finally:
            await subscription.unsubscribe()
        if refused:
            raise JetStreamError(refused)
        return digest.digest(), size, sent

    async def _purge(self, subject: str) -> None:
        """Drops the messages of one subject, a put's chunks; a failure leaves them (space, not harm)."""
        try:
            await api_call(self._nc, f"STREAM.PURGE.{self._stream}", {"filter": subject}, "purge chunks")
        except JetStreamError:
            pass

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
        """Writes the object's chunks to `out` in batches, on a thread (as is their SHA-256);
        returns their SHA-256. A pull consumer: nats-py's ordered push consumer, which its `get`
        uses, delivered 60 MB/s where this reads 4-5 times that (docs/journal/2026-11-27-shared-chains.md)."""
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=CONSUMER_IDLE_S
        )
        chunks = f"$O.{self.name}.C.{info.nuid}"
        subscription = await self._js.pull_subscribe(chunks, durable=None, stream=self._stream, config=config)
        digest, received = hashlib.sha256(), 0
        try:
            while received < info.chunks:
                batch = await subscription.fetch(min(FETCH_CHUNKS, info.chunks - received), timeout=REQUEST_TIMEOUT_S)
                await asyncio.to_thread(_write_and_hash, out, digest, [message.data for message in batch])
                received += len(batch)
        finally:
            await subscription.unsubscribe()
            await self._delete_consumer(subscription)
        return digest.digest()

    async def _delete_consumer(self, subscription) -> None:
        """A read's consumer, deleted now rather than when idle for CONSUMER_IDLE_S; a failure leaves
        it to that."""
        try:
            name = (await subscription.consumer_info()).name
            await self._js.delete_consumer(self._stream, name)
        except (nats.errors.Error, TimeoutError):
            pass

    async def objects(self) -> list[StoredObject]:
        """Every object the bucket holds, in the order they were put."""
        found = []
        for info, sequence in await self._metas(f"list the objects of object bucket {self.name}"):
            if info.get("deleted") or not info.get("name"):
                continue
            found.append(StoredObject(info["name"], info.get("size", 0), info.get("description") or "", sequence))
        return sorted(found, key=lambda stored: stored.sequence)

    async def _metas(self, what: str) -> list[tuple[dict, int]]:
        """Each meta message the stream holds (deleted objects' included), read as JSON, with its
        stream sequence; a message this module cannot read is no object of ours, and skipped."""
        metas = []
        for subject in await stream_subjects(self._nc, self._stream, f"$O.{self.name}.M.", what):
            message = await self._last_message(subject, what)
            try:
                info = json.loads(base64.b64decode(message.get("data") or ""))
            except ValueError:
                continue
            metas.append((info, message["seq"]))
        return metas

    async def delete(self, name: str) -> None:
        """Removes the object, its bytes and its meta message, if it is there: by purging both
        subjects, where nats-py's `delete` leaves a marker per name that every listing reads on."""
        try:
            info = await self._store.get_info(name, show_deleted=True)
        except nats.js.errors.ObjectNotFoundError:
            return
        except (nats.errors.Error, TimeoutError) as exc:
            raise jetstream_error(f"cannot delete {name!r} from object bucket {self.name}", exc) from None
        what = f"delete {name!r} from object bucket {self.name}"
        for subject in (self._meta_subject(name), f"$O.{self.name}.C.{info.nuid}"):
            await api_call(self._nc, f"STREAM.PURGE.{self._stream}", {"filter": subject}, what)

    async def drop_orphan_chunks(self, older_than_s: float) -> int:
        """Purges the chunks no object names (a put cut short by a kill leaves them, eating the
        bucket's room for good) whose last chunk came more than `older_than_s` before the stream's
        newest message (the server's clock, not this machine's): younger ones may be a put under
        way on another connection. Returns how many puts' chunks it purged."""
        what = f"sweep the chunks of object bucket {self.name}"
        newest = _stream_time((await self._stream_state(what)).get("last_ts", ""))
        named = {info.get("nuid") for info, _ in await self._metas(what)}
        dropped = 0
        for subject in await stream_subjects(self._nc, self._stream, f"$O.{self.name}.C.", what):
            if subject.rsplit(".", 1)[1] in named:
                continue
            last = await self._last_message(subject, what)
            if (newest - _stream_time(last.get("time", ""))).total_seconds() > older_than_s:
                await api_call(self._nc, f"STREAM.PURGE.{self._stream}", {"filter": subject}, what)
                dropped += 1
        return dropped

    async def _last_message(self, subject: str, what: str) -> dict:
        reply = await api_call(self._nc, f"STREAM.MSG.GET.{self._stream}", {"last_by_subj": subject}, what)
        return reply.get("message") or {}

    async def used_bytes(self) -> int:
        """What the bucket's stream holds now, every server's objects and meta messages included."""
        return (await self._stream_state(f"read object bucket {self.name}'s size")).get("bytes", 0)

    async def _stream_state(self, what: str) -> dict:
        info = await api_call(self._nc, f"STREAM.INFO.{self._stream}", {}, what)
        return info.get("state") or {}

    def _meta_subject(self, name: str) -> str:
        return f"$O.{self.name}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"

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


def _stream_time(text: str) -> datetime:
    """A stream message's time (RFC 3339 with nanoseconds, which datetime reads to microseconds);
    this machine's now where it cannot be read: a chunk's age then reads as none, and it is kept."""
    whole, _, fraction = text.rstrip("Z").partition(".")
    try:
        return datetime.fromisoformat(f"{whole}.{(fraction or '0')[:6]}").replace(tzinfo=UTC)
    except ValueError:
        return datetime.now(UTC)


def _read_and_hash(data: BinaryIO, digest: "hashlib._Hash", size: int) -> bytes:
    chunk = data.read(size)
    digest.update(chunk)
    return chunk


def _refusal(reply: bytes) -> str | None:
    """Why the stream refused a chunk (full, say), from its acknowledgement; None if it took it."""
    try:
        error = json.loads(reply).get("error")
    except ValueError:
        return f"an acknowledgement that is not JSON: {reply[:80]!r}"
    return None if error is None else str(error.get("description", error))


def _write_and_hash(out: BinaryIO, digest: "hashlib._Hash", chunks: list[bytes]) -> None:
    for chunk in chunks:
        out.write(chunk)
        digest.update(chunk)
