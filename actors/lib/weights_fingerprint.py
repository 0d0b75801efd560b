"""The name of the weights an executor loads, from what the checkpoint's files hold: the KV cache's
namespaces (actors/lib/block_hashes.py) start from it, so the disk tier and JetStream's shared
chains serve a block only under the weights that computed it.

By content, not by the files' times: the same checkpoint on another machine (copied, converted
from GGUF there, unpacked from a wheel) gets the same name, so servers on several machines share
KV chains; a checkpoint rewritten in place gets another. Hashing 16 GB of weights takes a second
or two from the page cache, and an executor hashes right after loading them, so they are there.
Each file's digest is kept in `<data-dir>/weights-digests.msgpack` by path, size, times and inode,
and a restart reads no weights again. Hidden files (`.cache/huggingface/...`, which a download
writes with its own times in them) are not part of the weights.
"""

import hashlib
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import structlog
import xxhash

from actors.lib.block_hashes import HASH_BYTES

log = structlog.get_logger()
CACHE_FILE = "weights-digests.msgpack"
READ_BYTES = 16 << 20  # of a file, per read
HASH_THREADS = 8  # files hashed at once (xxh3 and reads leave the GIL)


class FileDigest(msgspec.Struct, frozen=True, array_like=True):
    # What says the file is the one hashed: a file rewritten in place keeps its size and, copied
    # with its times (tar, rsync -a), its mtime, but not its ctime; another file has another inode.
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    digest: str  # XXH3-128 of the file's bytes, hex


def weights_fingerprint(model_path: str, dtype: str, data_dir: str | Path | None = None) -> str:
    """32 hex characters naming the weights in `model_path` (a directory or one file) loaded in
    `dtype`: every file's path within the checkpoint, size and digest. With `data_dir`, digests
    are remembered there for files whose size, times and inode have not changed."""
    root = Path(model_path)
    files = (
        sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
        if root.is_dir()
        else [root]
    )
    cache_path = Path(data_dir) / CACHE_FILE if data_dir is not None else None
    known = _read_cache(cache_path)
    digests = _digests(files, known)
    if cache_path is not None and any(known.get(str(p.resolve())) != d for p, d in zip(files, digests)):
        known.update({str(p.resolve()): d for p, d in zip(files, digests)})
        _write_cache(cache_path, known)
    described = [
        [str(p.relative_to(root) if root.is_dir() else p.name), d.size, d.digest] for p, d in zip(files, digests)
    ]
    return hashlib.blake2b(msgspec.msgpack.encode([dtype, described]), digest_size=HASH_BYTES).hexdigest()


def updated_fingerprint(fingerprint: str, update_id: str) -> str:
    """The weights after update `update_id` of those named `fingerprint`: a name no other weights get."""
    return hashlib.blake2b(f"{fingerprint}+{update_id}".encode(), digest_size=HASH_BYTES).hexdigest()


def _digests(files: list[Path], known: dict[str, FileDigest]) -> list[FileDigest]:
    def digest(path: Path) -> FileDigest:
        stat = path.stat()
        seen = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
        cached = known.get(str(path.resolve()))
        if cached is not None and (cached.size, cached.mtime_ns, cached.ctime_ns, cached.inode) == seen:
            return cached
        return FileDigest(*seen, _hash_file(path))

    with ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="weights-digest") as pool:
        return list(pool.map(digest, files))


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _hash_file(path: Path) -> str:
    state, buffer = xxhash.xxh3_128(), bytearray(READ_BYTES)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as f:
        while read := f.readinto(buffer):
            state.update(view[:read])
    return state.hexdigest()


def _read_cache(path: Path | None) -> dict[str, FileDigest]:
    if path is None or not path.exists():
        return {}
    try:
        return msgspec.msgpack.decode(path.read_bytes(), type=dict[str, FileDigest])
    except (OSError, msgspec.DecodeError) as error:  # a damaged cache costs a hash of the weights, nothing else
        log.warning("weights_digests_unreadable", path=str(path), error=str(error))
        return {}


def _write_cache(path: Path, digests: dict[str, FileDigest]) -> None:
    """Atomically (a temporary file renamed), so two executors writing at once leave one whole cache."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(msgspec.msgpack.encode(digests))
        os.replace(temp, path)
    except OSError as error:  # a full or read-only data dir: the next start hashes again
        temp.unlink(missing_ok=True)
        log.warning("weights_digests_not_saved", path=str(path), error=str(error))
