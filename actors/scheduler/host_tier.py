"""The scheduler's books of the host tier: which of the executor's host slots hold which block.

The executor holds the memory (actors/executor/kv_moves.py); this object decides what goes where.
A block is named by its chained hash (actors/lib/block_hashes.py) under a namespace of the weights'
generation, the model and dtype, the block size and the tenant, so a match never serves KV of
other weights or of another tenant's private prefix (v1: public prefixes are not shared across
tenants here). A slot is free, saving (a SaveBlocks sent, not yet reported done), or indexed
(saved: matchable), the indexed ones in least-recently-used order. Only indexed slots are
matched, so a load never reads a slot whose copy is not whole. v1: the books start empty with
each executor and each scheduler process, and with new weights.
"""

from collections import OrderedDict, deque
from typing import NamedTuple

from actors.lib.block_hashes import extend_hashes, namespace_key, root_hash
from actors.scheduler.sequence import Sequence

LAYOUT = "paged-v1"  # the executor's slot layout: one block of every layer, [layers, 2, block_size, heads, dim]


class HostStats(NamedTuple):
    slots: int
    used: int  # indexed or saving
    hits: int  # blocks loaded from the host instead of recomputed
    misses: int  # blocks a first lookup found neither on the GPU nor on the host


class HostTier:
    """Invariants: every slot is exactly one of free, saving or indexed; a hash is indexed or
    saving in at most one slot. A saving slot names the pool block its copy reads, which the
    caller keeps from reuse until `saved` or `unsaved` returns it."""

    def __init__(self, num_slots: int, block_size: int, fingerprint: str) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        self.num_slots = num_slots
        self.block_size = block_size
        self.fingerprint = fingerprint  # the model and KV dtype the executor serves
        self._free: deque[int] = deque(range(num_slots))
        self._index: OrderedDict[bytes, int] = OrderedDict()  # hash -> slot, least recently used first
        # slot -> (its hash, or None once cleared: freed when done; the pool block it reads)
        self._saving: dict[int, tuple[bytes | None, int]] = {}
        self._saving_hashes: set[bytes] = set()
        self.hits = self.misses = 0
        self.key = ""
        self.new_generation(0)

    def new_generation(self, generation: int) -> None:
        """New weights: nothing held so far is matched again; saves under way are freed when done."""
        self.key = namespace_key(f"{self.fingerprint}@{generation}", self.fingerprint, "-", self.block_size, LAYOUT)
        self._free.extend(self._index.values())
        self._index.clear()
        self._saving = {slot: (None, block) for slot, (_, block) in self._saving.items()}
        self._saving_hashes.clear()

    def hashes(self, seq: Sequence, tokens: list[int], count: int) -> list[bytes]:
        """The hashes of the first `count` whole blocks of `tokens`, a prefix of `seq`'s prompt and
        outputs; hashed once per sequence and namespace, extended as it grows."""
        tenant = seq.tenant
        key = f"{self.key}/{tenant.name}/{tenant.user}/{tenant.cache_salt}"
        if seq.hashed_under != key:
            seq.hashed_under, seq.block_hashes = key, []
        have = seq.block_hashes
        if len(have) < count:
            parent = have[-1] if have else root_hash(key)
            bs = self.block_size
            have += extend_hashes(parent, tokens[len(have) * bs : count * bs], bs)
        return have[:count]

    def match(self, hashes: list[bytes], count_misses: bool) -> list[int]:
        """The slots of the leading `hashes` that are indexed (most recently used now); with
        `count_misses`, the rest count as misses (a request's first lookup)."""
        slots = []
        for h in hashes:
            slot = self._index.get(h)
            if slot is None:
                break
            self._index.move_to_end(h)
            slots.append(slot)
        if count_misses:
            self.misses += len(hashes) - len(slots)
        return slots

    def to_save(self, hashes: list[bytes], blocks: list[int]) -> tuple[list[int], list[int]]:
        """Slots for the blocks (holding the KV hashed `hashes`) that the host lacks: (blocks, slots)
        to save, each slot now saving. Slots come free, else from the least recently used indexed
        blocks; with none left the rest are not saved."""
        saving_blocks, slots = [], []
        for h, block in zip(hashes, blocks, strict=True):
            if h in self._index:
                self._index.move_to_end(h)
                continue
            if h in self._saving_hashes:
                continue
            if self._free:
                slot = self._free.popleft()
            elif self._index:
                slot = self._index.popitem(last=False)[1]
            else:
                break  # every slot is saving
            self._saving[slot] = (h, block)
            self._saving_hashes.add(h)
            saving_blocks.append(block)
            slots.append(slot)
        return saving_blocks, slots

    def saved(self, slots: list[int]) -> list[int]:
        """The executor made these saves: their blocks become matchable; returns the pool blocks
        they read, now free of the save. Slots not saving (of an executor or a scheduler before) are
        ignored."""
        blocks = []
        for slot in slots:
            if (entry := self._saving.pop(slot, None)) is None:
                continue
            h, block = entry
            blocks.append(block)
            if h is None:
                self._free.append(slot)
            else:
                self._saving_hashes.discard(h)
                self._index[h] = slot
        return blocks

    def unsaved(self, slots: list[int]) -> list[int]:
        """The executor abandoned these saves: the slots are free again; returns the blocks."""
        blocks = []
        for slot in slots:
            if (entry := self._saving.pop(slot, None)) is None:
                continue
            h, block = entry
            self._saving_hashes.discard(h)
            self._free.append(slot)
            blocks.append(block)
        return blocks

    def stats(self) -> HostStats:
        return HostStats(self.num_slots, self.num_slots - len(self._free), self.hits, self.misses)
