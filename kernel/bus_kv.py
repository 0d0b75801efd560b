"""A JetStream key-value bucket as actors use it: bytes by key, in a bucket that keeps only each
key's latest value. kernel/bus.py opens one (`Bus.key_value`); what goes wrong on the wire comes
back as `JetStreamError` (kernel/bus_jetstream.py), never as a nats exception.

A bucket lives in the NATS server, not in one deployment: every client of that server that names
the same bucket sees the same keys, which is how servers on several machines share state. Names
come from kernel/subjects.py, one bucket per namespace.
"""

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from kernel.bus_jetstream import REQUEST_TIMEOUT_S, jetstream_error, stream_subjects


class KeyValueBucket:
    """One bucket. Keys are JetStream's: letters, digits and `-_=./`."""

    def __init__(self, kv: KeyValue, name: str, nc: Client) -> None:
        self._kv = kv
        self.name = name
        self._nc = nc

    async def put(self, key: str, value: bytes) -> None:
        """Replaces the key's value. Raises `JetStreamError` if the bucket did not take it (a value
        over the server's max_payload, say)."""
        try:
            await self._kv.put(key, value)
        except (nats.errors.Error, TimeoutError) as exc:
            raise jetstream_error(f"cannot put {key!r} into bucket {self.name}", exc) from None

    async def get(self, key: str) -> bytes | None:
        """The key's value, or None if it has none (never put, or deleted)."""
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # a deleted key raises it too
            return None
        except (nats.errors.Error, TimeoutError) as exc:
            raise jetstream_error(f"cannot get {key!r} from bucket {self.name}", exc) from None
        return entry.value or b""

    async def delete(self, key: str) -> None:
        """Removes the key's value, if it has one."""
        try:
            await self._kv.purge(key)  # a purge drops the old value's bytes too, not only hides them
        except (nats.errors.Error, TimeoutError) as exc:
            raise jetstream_error(f"cannot delete {key!r} from bucket {self.name}", exc) from None

    async def keys(self) -> list[str]:
        """Every key with a value, and the keys deleted since the last `drop_delete_markers` (a
        deleted key's `get` is None), in no particular order.

        Read from the bucket's stream, which names every subject it holds (STREAM.INFO with a
        subjects filter, page by page), not from nats-py's `KeyValue.keys()`: that follows a
        watcher which can end before its replay has, under concurrent writes or with deliveries in
        flight, and leave out keys that had values all along (nats.py pull request #995)."""
        prefix = f"$KV.{self.name}."
        subjects = await stream_subjects(self._nc, f"KV_{self.name}", prefix, f"list the keys of bucket {self.name}")
        return [subject[len(prefix) :] for subject in subjects]

    async def drop_delete_markers(self, older_than_s: int = 1800) -> None:
        """Removes what deleted keys leave behind (a marker each, which every listing of the keys
        reads past) once older than `older_than_s`."""
        try:
            await self._kv.purge_deletes(olderthan=older_than_s)
        except (nats.errors.Error, TimeoutError) as exc:
            raise jetstream_error(f"cannot drop the delete markers of bucket {self.name}", exc) from None


async def open_bucket(nc: Client, name: str) -> KeyValueBucket:
    """The bucket `name`, made if it does not exist yet, keeping one value per key. Raises
    `JetStreamUnavailable` where the server has no JetStream."""
    js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
    try:
        try:
            kv = await js.key_value(name)
        except nats.js.errors.BucketNotFoundError:
            # Two servers may make it at once: the second's identical request succeeds as well.
            kv = await js.create_key_value(bucket=name, history=1)
    except (nats.errors.Error, TimeoutError) as exc:
        raise jetstream_error(f"cannot open the key-value bucket {name}", exc) from None
    return KeyValueBucket(kv, name, nc)
