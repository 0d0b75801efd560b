"""The disk tier of the KV cache: the scheduler's conversation with the cache_tier actor on
`<ns>.cache_tier.requests`.

The scheduler keeps the books of the host tier (actors/scheduler/host_tier.py): which host slot
holds which block. The cache_tier actor moves bytes between those slots (a shared-memory segment
the executor made, which it maps by name) and block-chain files on disk (actors/cache_tier/
disk_store.py). Blocks are named by their chained hashes (actors/lib/block_hashes.py) inside a
namespace: a directory of the disk tier, one per state of the weights.

The scheduler gives the cache_tier the slots of each move and keeps them from any other use until
the reply, or until a cache_tier of another `instance_id` announces itself (the one that was
reading or writing them is gone). It keeps a list of the blocks the disk holds too (ListBlocks, then
what each spill stored), so that a prompt the disk cannot continue never waits on a fetch. Each
answer says what the disk holds in the namespace it was about (`DiskFigures`): the scheduler shows
the last it heard on /admin/cache and /metrics, so no figure costs the disk tier a request. An admin's
flush of the disk tier is one more request (FlushDisk), ordered after the spills sent before it.
"""

import msgspec

from schemas.errors import Error

Namespace = str  # 32 hex characters: namespace_key's


class DiskFigures(msgspec.Struct, frozen=True):
    """What the disk tier holds in one namespace, as it answers a request about it."""

    blocks: int
    bytes: int  # the files', headers included
    capacity_bytes: int  # --disk-kv-gb, for each namespace


class SpillBlocks(msgspec.Struct, frozen=True, tag="spill_blocks"):
    """Write the blocks in `slots` to disk: slots[i] holds the block hashed hashes[i], whose tokens
    are token_ids[i * block_size:(i + 1) * block_size] and whose chain's previous block is
    parents[i] (None: the first block of a prompt). Each block is its own chain file: the blocks
    spilled together need not follow one another."""

    segment: str  # the host segment's name (the executor's ExecutorInfo.host_segment)
    namespace: Namespace
    slots: list[int]
    hashes: list[bytes]
    parents: list[bytes | None]
    token_ids: list[int]
    # The namespace of the checkpoint's own weights, which later servers match: shared with other
    # machines where the disk tier shares its chains (actors/cache_tier/shared_chains.py).
    lasting: bool = False


class BlocksSpilled(msgspec.Struct, frozen=True, tag="blocks_spilled"):
    """The slots are free of the cache_tier; `stored` are the hashes the disk holds now (a full or
    failing disk stores fewer)."""

    stored: list[bytes]
    figures: DiskFigures | None = None


class FetchBlocks(msgspec.Struct, frozen=True, tag="fetch_blocks"):
    """Read the longest run of `hashes` that the disk holds, from the first, into `slots` (as many
    as hashes); a block that fails its checksum ends the run there."""

    segment: str
    namespace: Namespace
    slots: list[int]
    hashes: list[bytes]


class BlocksFetched(msgspec.Struct, frozen=True, tag="blocks_fetched"):
    count: int  # slots[:count] hold hashes[:count]; the other slots are free of the cache_tier
    figures: DiskFigures | None = None


class ListBlocks(msgspec.Struct, frozen=True, tag="list_blocks"):
    """Which blocks the disk holds in `namespace` (the segment names the block size): one page of
    the listing, from its `start`th block. A disk of some TB holds more hashes than one bus message."""

    segment: str
    namespace: Namespace
    start: int = 0


class BlocksListed(msgspec.Struct, frozen=True, tag="blocks_listed"):
    hashes: list[bytes]
    figures: DiskFigures | None = None
    next_start: int | None = None  # the next page's `start`; None: this page is the last


class FlushDisk(msgspec.Struct, frozen=True, tag="flush_disk"):
    """Delete every block file and forget every block, in every namespace (an admin's flush)."""


class DiskFlushed(msgspec.Struct, frozen=True, tag="disk_flushed"):
    blocks: int  # forgotten from the namespaces the cache_tier had open
    files: int  # deleted, in every namespace


class CacheTierStarted(msgspec.Struct, frozen=True, tag="cache_tier_started"):
    """Published by a cache_tier when it starts: the slots an earlier one was moving are free."""

    instance_id: str


CacheTierRequest = SpillBlocks | FetchBlocks | ListBlocks | FlushDisk
CacheTierReply = BlocksSpilled | BlocksFetched | BlocksListed | DiskFlushed | Error
