"""Names for KV blocks that hold across processes, restarts and machines: the cache tiers
(actors/cache_tier/) index and file blocks by these hashes, so a block computed by one server is
found by the next one that runs the same weights, tokenizer and KV layout, and by no other.

A block's hash covers every token before it (the chain), so equal hashes mean equal prefixes; the
namespace covers everything else the KV depends on. blake2b, not Python's `hash()`, which is
salted per process; token ids as little-endian uint32, whatever the machine's byte order.
"""

import hashlib
import struct
from collections.abc import Sequence

import msgspec

HASH_BYTES = 16
# Bumped when what goes into a namespace key changes, so old keys can never be produced again.
NAMESPACE_FORMAT = "kv-namespace-1"


def namespace_key(weights: str, tokenizer: str, kv_dtype: str, block_size: int, layout: str) -> str:
    """32 hex characters naming what a block's KV depends on besides its tokens: a fingerprint of
    the weights, of the tokenizer and chat template, the KV cache's dtype, tokens per block and the
    version of the KV layout. Change any one and no block of the old key is ever served."""
    for field, value in (("weights", weights), ("tokenizer", tokenizer), ("kv_dtype", kv_dtype), ("layout", layout)):
        if not value:
            raise ValueError(f"{field} must be a non-empty fingerprint")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, not {block_size}")
    # msgpack of a list: each field's length is encoded, so no two field tuples give the same bytes.
    fields = msgspec.msgpack.encode([NAMESPACE_FORMAT, weights, tokenizer, kv_dtype, block_size, layout])
    return hashlib.blake2b(fields, digest_size=HASH_BYTES).hexdigest()


def root_hash(namespace: str) -> bytes:
    """The hash "before" a prompt's first block: every chain of the namespace starts from it."""
    return hashlib.blake2b(namespace.encode(), digest_size=HASH_BYTES).digest()


def extend_hashes(parent: bytes, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The hashes of the whole blocks of `token_ids`, which follow the block hashed `parent` (or
    begin the prompt, with `parent = root_hash(namespace)`); a last partial block has none."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, not {block_size}")
    if len(parent) != HASH_BYTES:
        raise ValueError(f"parent must be a {HASH_BYTES}-byte hash, not {len(parent)} bytes")
    whole = len(token_ids) - len(token_ids) % block_size
    try:
        packed = struct.pack(f"<{whole}I", *token_ids[:whole])
    except struct.error as error:
        raise ValueError(f"token_ids must be integers in [0, 2**32): {error}") from None
    step = block_size * 4
    hashes = []
    for start in range(0, len(packed), step):
        parent = hashlib.blake2b(parent + packed[start : start + step], digest_size=HASH_BYTES).digest()
        hashes.append(parent)
    return hashes


def block_hashes(token_ids: Sequence[int], block_size: int, namespace: str) -> list[bytes]:
    """One 16-byte hash per whole block of the prompt `token_ids`, chained:
    h_i = blake2b(h_{i-1} || block i's tokens), h_-1 = blake2b(namespace)."""
    return extend_hashes(root_hash(namespace), token_ids, block_size)
