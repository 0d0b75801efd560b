"""The scheduler's books of the host tier: which of the executor's host slots hold which block.

The executor holds the memory (actors/executor/kv_moves.py); this object decides what goes where.
A block is named by its chained hash (actors/lib/block_hashes.py) under a namespace of the weights
(their fingerprint, and the cache generation with this process's nonce after an update), the dtype,
the block size and the tenant, so a match never serves KV of other weights or of another tenant's
private prefix (v1: public prefixes are not shared across tenants here). A slot is free, saving (a
SaveBlocks sent, not yet reported done), or indexed (saved: matchable), the indexed ones in
least-recently-used order. Only indexed slots are matched, so a load never reads a slot whose copy
is not whole; and a slot that a sent LoadBlocks reads is pinned (`loading`) until the executor
reports the load made (`loaded`), so no eviction, flush or fetch refills it under the load.

With a disk tier (the cache_tier actor, schemas/cache.py) every indexed block is also written to
disk, oldest first (`take_spill`), and a slot the disk tier reads ("spilling") is not reused until
it is done; a block evicted before its turn is not written (the disk runs behind a busy host). A
fetch from disk reserves free slots ("fetching") that become indexed when the disk tier has filled
them. The books start empty with each executor and each scheduler process (a dead executor's loads
stopped with it; those of a live one that a new scheduler or epoch took over only write blocks
their new owner writes again before any step reads them); what the disk holds outlives both.
"""

import uuid
from collections import Counter, OrderedDict, deque
from typing import NamedTuple

from actors.lib.block_hashes import extend_hashes, namespace_key, root_hash
from actors.scheduler.sequence import Sequence

LAYOUT = "paged-v1"  # the executor's slot layout: one block of every layer, [layers, 2, block_size, heads, dim]


class HostStats(NamedTuple):
    slots: int
    blocks: int  # indexed: matchable
    pending: int  # on their way in: copies from the GPU, and fetches from the disk, under way


class Spill(NamedTuple):
    """A block for the disk tier: its slot, hash, the hash before it in its chain, its tokens."""

    slot: int
    block_hash: bytes
    parent: bytes
    token_ids: list[int]


class HostTier:
    """Invariants: every slot is exactly one of free, saving, indexed, fetching or dropped; a hash
    is indexed or saving in at most one slot. A saving slot names the pool block its copy reads,
    which the caller keeps from reuse until `saved` or `unsaved` returns it. An indexed slot is not
    evicted while a reader has it: the disk tier (spilling, until `spilled`) or the executor (a
    sent load, until `loaded`). A slot a flush drops while read is "dropped": free once unread."""

    def __init__(self, num_slots: int, block_size: int, fingerprint: str, disk: bool = False) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        self.num_slots = num_slots
        self.block_size = block_size
        self.fingerprint = fingerprint  # the weights and KV dtype the executor serves
        self.disk = disk
        self.nonce = uuid.uuid4().hex  # this process's: generations after the first are its own
        self._free: deque[int] = deque(range(num_slots))
        self._index: OrderedDict[bytes, int] = OrderedDict()  # hash -> slot, least recently used first
        # slot -> (its hash, or None once cleared: freed when done; the pool block it reads)
        self._saving: dict[int, tuple[bytes | None, int]] = {}
        self._saving_hashes: set[bytes] = set()
        self._chains: dict[int, Spill] = {}  # saving or indexed slots the disk tier has not had yet
        self._unspilled: OrderedDict[int, None] = OrderedDict()  # indexed, for the disk tier, oldest first
        self._spilling: set[int] = set()  # the disk tier reads them now
        self._fetching: set[int] = set()  # the disk tier writes them now
        self._loading: Counter[int] = Counter()  # slot -> loads sent that the executor has not reported made
        self._dropped: set[int] = set()  # out of the index while read: free once no reader is left
        self.key = ""
        self.lasting = True  # the namespace is the checkpoint's own (generation 0)
        self.new_generation(0)

    def new_generation(self, generation: int) -> None:
        """New weights: nothing held so far is matched again; saves under way are freed when done,
        and the disk tier's moves when it is done with them. Generation 0 is the checkpoint's own
        weights, whose blocks the disk tier keeps across restarts."""
        self.lasting = generation == 0
        weights = self.fingerprint if generation == 0 else f"{self.fingerprint}@{generation}/{self.nonce}"
        # The fingerprint ("weights|dtype", ExecutorInfo's) hashes every file of the model dir: the
        # tokenizer and chat template are among them, and the KV dtype is in it, hence the "-".
        self.key = namespace_key(weights, self.fingerprint, "-", self.block_size, LAYOUT)
        self.flush()

    def flush(self) -> int:
        """Drops every block: none is matched again, the indexed slots are free (those the disk
        tier or a load reads once done), saves under way are freed when done, and the disk tier is
        not given the blocks it has not had. Fetches under way land as usual (the disk's blocks, for
        the requests that wait for them). Returns the blocks dropped (indexed or saving)."""
        dropped = len(self._index) + len(self._saving_hashes)
        for slot in self._index.values():
            self._dropped.add(slot)
            self._settle(slot)
        self._index.clear()
        self._unspilled.clear()
        self._chains.clear()
        self._saving = {slot: (None, block) for slot, (_, block) in self._saving.items()}
        self._saving_hashes.clear()
        return dropped

    def root(self, seq: Sequence) -> bytes:
        """The hash before the first block of `seq`'s tokens: its tenant's chains start there."""
        tenant = seq.tenant
        return root_hash(f"{self.key}/{tenant.name}/{tenant.user}/{tenant.cache_salt}")

    def hashes(self, seq: Sequence, tokens: list[int], count: int) -> list[bytes]:
        """The hashes of the first `count` whole blocks of `tokens`, a prefix of `seq`'s prompt and
        outputs; hashed once per sequence and namespace, extended as it grows."""
        if seq.hashed_under != self.key:
            seq.hashed_under, seq.block_hashes = self.key, []
        have = seq.block_hashes
        if len(have) < count:
            parent = have[-1] if have else self.root(seq)
            bs = self.block_size
            have += extend_hashes(parent, tokens[len(have) * bs : count * bs], bs)
        return have[:count]

    def match(self, hashes: list[bytes]) -> list[int]:
        """The slots of the leading `hashes` that are indexed (most recently used now)."""
        slots = []
        for h in hashes:
            slot = self._index.get(h)
            if slot is None:
                break
            self._index.move_to_end(h)
            slots.append(slot)
        return slots

    def loading(self, slots: list[int]) -> None:
        """A LoadBlocks of these matched slots is sent: none is refilled until `loaded` names it."""
        self._loading.update(slots)

    def loaded(self, slots: list[int]) -> None:
        """The executor made loads of these slots (a slot loaded twice is named twice): read, they
        may be evicted again, and a dropped one is free. Slots with no load sent (of an executor
        or a scheduler before) are ignored."""
        for slot in slots:
            if self._loading[slot] > 1:
                self._loading[slot] -= 1
            elif self._loading.pop(slot, None) is not None:
                self._settle(slot)

    def to_save(
        self, hashes: list[bytes], blocks: list[int], tokens: list[int], root: bytes
    ) -> tuple[list[int], list[int]]:
        """Slots for the blocks (holding the KV hashed `hashes`, of `tokens`, whose chain starts at
        `root`) that the host lacks: (blocks, slots) to save, each slot now saving. Slots come free,
        else from the least recently used evictable blocks; with none left the rest are not saved."""
        saving_blocks, slots = [], []
        bs = self.block_size
        for i, (h, block) in enumerate(zip(hashes, blocks, strict=True)):
            if h in self._index:
                self._index.move_to_end(h)
                continue
            if h in self._saving_hashes:
                continue
            slot = self._take_slot()
            if slot is None:
                break  # every slot is saving, or waits for the disk tier
            self._saving[slot] = (h, block)
            self._saving_hashes.add(h)
            if self.disk:
                self._chains[slot] = Spill(slot, h, hashes[i - 1] if i else root, tokens[i * bs : (i + 1) * bs])
            saving_blocks.append(block)
            slots.append(slot)
        return saving_blocks, slots

    def saved(self, slots: list[int]) -> list[int]:
        """The executor made these saves: their blocks become matchable (and wait for the disk tier);
        returns the pool blocks they read, now free of the save. Slots not saving (of an executor or
        a scheduler before) are ignored."""
        blocks = []
        for slot in slots:
            if (entry := self._saving.pop(slot, None)) is None:
                continue
            h, block = entry
            blocks.append(block)
            if h is None:
                self._chains.pop(slot, None)
                self._free.append(slot)
            else:
                self._saving_hashes.discard(h)
                self._index[h] = slot
                if slot in self._chains:
                    self._unspilled[slot] = None
        return blocks

    def unsaved(self, slots: list[int]) -> list[int]:
        """The executor abandoned these saves: the slots are free again; returns the blocks."""
        blocks = []
        for slot in slots:
            if (entry := self._saving.pop(slot, None)) is None:
                continue
            h, block = entry
            self._saving_hashes.discard(h)
            self._chains.pop(slot, None)
            self._free.append(slot)
            blocks.append(block)
        return blocks

    # -- the disk tier ------------------------------------------------------------------------

    def take_spill(self, limit: int) -> list[Spill]:
        """Up to `limit` indexed blocks the disk tier has not had, oldest first: spilling now."""
        taken = []
        while self._unspilled and len(taken) < limit:
            slot, _ = self._unspilled.popitem(last=False)
            self._spilling.add(slot)
            taken.append(self._chains[slot])
        return taken

    def spilled(self, slots: list[int]) -> None:
        """The disk tier is done reading these slots (whether the disk took them or not)."""
        for slot in slots:
            if slot in self._spilling:
                self._spilling.discard(slot)
                self._chains.pop(slot, None)
                self._settle(slot)

    def reserve(self, count: int) -> list[int]:
        """Up to `count` slots for the disk tier to fill: fetching now."""
        slots = []
        while len(slots) < count and (slot := self._take_slot()) is not None:
            slots.append(slot)
        self._fetching.update(slots)
        return slots

    def fetched(self, slots: list[int], hashes: list[bytes], count: int, key: str) -> int:
        """The disk tier filled slots[:count] with the blocks hashed hashes[:count] (under
        namespace `key`): they become indexed (the disk has them already); the other slots are free
        again. Returns how many were indexed (none if the namespace changed meanwhile)."""
        indexed = 0
        for i, slot in enumerate(slots):
            self._fetching.discard(slot)
            if i < count and key == self.key and hashes[i] not in self._index and hashes[i] not in self._saving_hashes:
                self._index[hashes[i]] = slot
                indexed += 1
            else:
                self._free.append(slot)
        return indexed

    def adopt_in_flight(self, old: "HostTier") -> None:
        """The slots that `old` (the books of an executor before, over the same segment) has the
        disk tier moving: out of use here too until it answers."""
        moving = (old._fetching | old._spilling) & set(self._free)
        self._free = deque(slot for slot in self._free if slot not in moving)
        self._fetching |= old._fetching & moving
        self._spilling |= old._spilling & moving
        self._dropped |= old._spilling & moving  # indexed by no books here: free once spilled

    def disk_tier_restarted(self) -> None:
        """The disk tier that was reading or writing slots is gone: fetches are void, spills are
        sent again."""
        self._free.extend(self._fetching)
        self._fetching.clear()
        spilling, self._spilling = self._spilling, set()
        for slot in spilling:
            if slot in self._chains:  # still indexed: written again by the new one
                self._unspilled[slot] = None
            else:
                self._settle(slot)

    def stats(self) -> HostStats:
        return HostStats(self.num_slots, len(self._index), len(self._saving_hashes) + len(self._fetching))

    def _take_slot(self) -> int | None:
        """A free slot, else the least recently used indexed one that neither the disk tier nor a
        load reads, evicted now (if the disk tier has not had it yet, it never will: the disk takes
        what it can, and the host keeps the newest blocks)."""
        if self._free:
            return self._free.popleft()
        for h, slot in self._index.items():
            if slot not in self._spilling and slot not in self._loading:
                del self._index[h]
                self._unspilled.pop(slot, None)
                self._chains.pop(slot, None)
                return slot
        return None

    def _settle(self, slot: int) -> None:
        """A dropped slot that no one reads any more is free."""
        if slot in self._dropped and slot not in self._spilling and slot not in self._loading:
            self._dropped.discard(slot)
            self._free.append(slot)

    @property
    def unspilled(self) -> int:
        """Indexed blocks the disk tier has not had yet."""
        return len(self._unspilled) + len(self._spilling)
