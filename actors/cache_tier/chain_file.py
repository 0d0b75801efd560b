"""The file format of the disk tier (actors/cache_tier/disk_store.py): one file holds one chain, a
run of consecutive KV blocks of one prefix. The store decides which chains live; this module only
writes a chain durably and reads it back, checked.

Layout of a file:
    MAGIC (8 bytes) | version, header length, header crc32 (3 x uint32, little-endian) |
    header (msgpack `ChainHeader`) | zeros up to a multiple of DATA_ALIGN | block 0 | block 1 | ...
Blocks start page-aligned, so a reader could one day read them with O_DIRECT or map them.
"""

import os
import secrets
import struct
import zlib
from pathlib import Path

import msgspec
import xxhash

from actors.lib.block_hashes import HASH_BYTES, extend_hashes, root_hash

MAGIC = b"KVCHAIN\x00"
VERSION = 2  # 2: blocks checked by XXH3, not crc32
PREFIX = struct.Struct("<8sIII")  # magic, version, header length, header crc32
DATA_ALIGN = 4096
SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"
# A header larger than this is damage, not a chain (a 1M-token chain's header is about 5 MB).
MAX_HEADER_BYTES = 64 << 20


class ChainHeader(msgspec.Struct, frozen=True, array_like=True):
    namespace: str
    block_bytes: int
    parent: bytes | None  # the hash of the block before the chain; None: the chain starts a prompt
    hashes: list[bytes]  # one per block
    token_ids: list[int]  # the blocks' tokens, block_size of them per block
    checksums: list[int]  # `checksum` of each block's bytes


class Malformed(ValueError):
    """A file that is not a whole chain of this namespace: removed, never served."""


_HEADER_ENCODER = msgspec.msgpack.Encoder()
_HEADER_DECODER = msgspec.msgpack.Decoder(ChainHeader)


def _data_offset(header_len: int) -> int:
    return -(-(PREFIX.size + header_len) // DATA_ALIGN) * DATA_ALIGN


def checksum(block: memoryview) -> int:
    # XXH3: it catches flipped bits and torn writes, which is its job here (the blocks' identity is
    # the hash chain in the header), at about 10 GB/s a thread, 4-5 times zlib's crc32, and it
    # releases the GIL. A restart's prompt waits for its blocks to be read and checked, and with
    # crc32 the check, not the read, set the pace (docs/journal/2026-11-27-disk-reads.md).
    return xxhash.xxh3_64_intdigest(block)


def file_name(hashes: list[bytes]) -> str:
    return hashes[-1].hex() + SUFFIX


def file_bytes(header_len: int, blocks: int, block_bytes: int) -> int:
    return _data_offset(header_len) + blocks * block_bytes


def encode_header(header: ChainHeader) -> bytes:
    return _HEADER_ENCODER.encode(header)


def write_chain(directory: Path, header: ChainHeader, encoded_header: bytes, blocks: list[memoryview]) -> Path:
    """Writes the chain under its name, durably: a temp file in the same directory, fsync, rename
    (atomic: a reader sees the old file or the whole new one, and two writers of one chain leave
    one whole file), fsync of the directory (the rename survives a power cut). Raises OSError."""
    final = directory / file_name(header.hashes)
    temp = directory / f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    prefix = PREFIX.pack(MAGIC, VERSION, len(encoded_header), zlib.crc32(encoded_header))
    padding = bytes(_data_offset(len(encoded_header)) - PREFIX.size - len(encoded_header))
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for buffer in (prefix, encoded_header, padding, *blocks):
            view = memoryview(buffer).cast("B")
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        temp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
    return final


def read_header(fd: int, namespace: str, block_bytes: int) -> tuple[ChainHeader, int]:
    """The header of an open chain file and where its blocks start, checked whole: its crc32, its namespace and block size, and
    its hashes recomputed from its parent and tokens (so a block is only ever found under the hash
    of the tokens it was computed for). Reads no block. Raises Malformed or OSError."""
    prefix = os.pread(fd, PREFIX.size, 0)
    if len(prefix) < PREFIX.size:
        raise Malformed("shorter than its prefix")
    magic, version, header_len, header_crc = PREFIX.unpack(prefix)
    if magic != MAGIC or version != VERSION:
        raise Malformed(f"not a chain file of version {VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise Malformed(f"header of {header_len} bytes")
    encoded = os.pread(fd, header_len, PREFIX.size)
    if len(encoded) < header_len or zlib.crc32(encoded) != header_crc:
        raise Malformed("header fails its crc")
    try:
        header = _HEADER_DECODER.decode(encoded)
    except msgspec.DecodeError as error:
        raise Malformed(f"header does not decode: {error}") from None
    if header.namespace != namespace or header.block_bytes != block_bytes:
        raise Malformed(f"of namespace {header.namespace!r} with blocks of {header.block_bytes} bytes")
    blocks = len(header.hashes)
    if not blocks or not header.token_ids or len(header.checksums) != blocks or len(header.token_ids) % blocks:
        raise Malformed("header's lists disagree on the number of blocks")
    parent = header.parent if header.parent is not None else root_hash(namespace)
    if len(parent) != HASH_BYTES or extend_hashes(parent, header.token_ids, len(header.token_ids) // blocks) != (
        header.hashes
    ):
        raise Malformed("hashes do not follow from the parent and the tokens")
    return header, _data_offset(header_len)


def read_block(fd: int, out: memoryview, offset: int) -> bool:
    """Fills `out` from the file at `offset`; False if the file ends first."""
    view = memoryview(out).cast("B")
    while view:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            return False
        view, offset = view[got:], offset + got
    return True
