"""The KV blocks of the scheduler's sequences: the block pool and the radix cache behind one
object. It gives a starting sequence the cached prefix it may read and fresh blocks for the rest,
grows decoding ones, forks choices, and leaves computed blocks to the cache. With a host tier
(host_tier.py), the blocks that go into the cache are written through to host slots, and a start
whose prefix continues on the host past the GPU's loads those blocks back instead of recomputing
them; the KV moves this asks of the executor wait in `take_commands`. It counts which tier served
each request's prefix (tier_figures.py)."""

from actors.scheduler.block_pool import BlockPool
from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.disk_tier import DiskTier
from actors.scheduler.host_tier import HostTier
from actors.scheduler.radix_cache import RadixCache
from actors.scheduler.radix_node import MatchResult, Node
from actors.scheduler.sequence import Sequence
from actors.scheduler.tier_figures import TierCounts
from schemas.admin import PrefixPublished, TierName
from schemas.step import Command, CopyBlock, LoadBlocks, SaveBlocks

# The match of a sequence that took nothing from the cache (a forked choice): nothing to unlock.
NO_PREFIX = MatchResult(Node((), [], None), [], 0)


class KVManager:
    """Owns `seq.blocks` and `seq.cached` of every sequence.

    Invariants: a sequence that holds blocks holds one pool reference on each of `seq.blocks`
    and one cache lock on `seq.cached.node`, whose blocks lead `seq.blocks`; one that holds none
    has `blocks == []` and `cached is None`. A sequence shares only the blocks before the first
    token it computes (a cached prefix, or the prompt of the choice it forks); the blocks it
    writes have no other holder until they go into the cache. An allocation takes all it asks for
    or nothing, and evicts only cached prefixes that no sequence locks. A sequence's KV goes into
    the cache only under the generation it was computed in (`seq.kv_generation`): KV of older
    weights, even continued under new ones, is never cached again. A block being saved to the
    host holds one more pool reference, until the executor reports the save done; a host slot a
    sent load reads stays pinned in the host tier until the executor reports the load made.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        prefix_caching: bool,
        tenancy: TenancyPolicy,
        host_slots: int = 0,
        fingerprint: str = "",
        disk_segment: str = "",
        block_bytes: int = 0,
    ) -> None:
        self.pool = BlockPool(num_blocks)
        self.cache = RadixCache(self.pool, block_size, enabled=prefix_caching, tenancy=tenancy)
        self.block_size = block_size
        self.block_bytes = block_bytes  # one block of every layer's K and V (the executor's): a host slot's size
        self.counts = TierCounts()
        # The host tier only ever holds what the radix cache stores: nothing without it.
        self.host = (
            HostTier(host_slots, block_size, fingerprint, disk=bool(disk_segment))
            if host_slots > 0 and prefix_caching
            else None
        )
        # The disk tier behind the host tier: `disk_segment` names the executor's host segment.
        self.disk = DiskTier(self.host, self.cache, disk_segment) if self.host is not None and disk_segment else None
        self._commands: list[Command] = []  # saves and loads for the executor, in the order made

    def take_commands(self) -> list[Command]:
        """The KV moves asked since the last call, to go before any command that follows them."""
        commands, self._commands = self._commands, []
        return commands

    def start(self, seq: Sequence) -> bool:
        """Gives `seq` the cached prefix of its tokens that it may read, locked, and fresh blocks
        for the rest and one token more; False, holding nothing, if those cannot be had. The first
        start of a request counts as its lookup in the hit figures; readmissions do not."""
        tokens = seq.prompt_ids + seq.output_ids
        first = not seq.looked_up
        if first:
            self.cache.record_lookup(tokens, seq.tenant)
            seq.looked_up = True
        lookup = self.lookup_tokens(seq)
        cached = self.cache.match(lookup, seq.tenant)
        self.cache.lock(cached.node)  # so that allocating cannot evict it
        on_gpu = len(cached.blocks)
        if self.host is not None:
            cached = self._load_from_host(seq, lookup, cached)
        if first:
            self._count_lookup(seq, lookup, on_gpu, len(cached.blocks) - on_gpu)
        own = self._allocate(self._blocks_for(len(tokens) + 1) - len(cached.blocks))
        if own is None:
            self.cache.unlock(cached.node)
            return False
        self.pool.retain(cached.blocks)
        seq.blocks, seq.cached = cached.blocks + own, cached
        seq.kv_generation = self.cache.generation
        return True

    def waits_for_disk(self, seq: Sequence) -> bool:
        """Whether `seq` waits for its prefix to come from the disk tier before its start; while it
        does, the pieces already read load into the GPU's tree."""
        if self.disk is None:
            return False
        lookup = self.lookup_tokens(seq)
        if not self.disk.waits(seq, lookup):
            return False
        if seq.piece_landed:
            seq.piece_landed = False
            self._prefetch(seq, lookup)
        return True

    def _prefetch(self, seq: Sequence, lookup: list[int]) -> None:
        """Loads into the GPU's tree, ahead of `seq`'s start, the blocks of its prefix that the host
        holds past the GPU's: a fetch's pieces cross to the GPU while the disk reads the next ones.
        The tree holds them unlocked, as any cached prefix. A block evicted while its load still
        lands may be reused at once: the caller sends the load before any later command of the
        round (a fork's copy), and a step writes layer i of a block only once the loads' layer i
        has landed (gpu/layer_arrivals.py)."""
        cached = self.cache.match(lookup, seq.tenant)
        self.cache.lock(cached.node)
        longer = self._load_from_host(seq, lookup, cached)
        seq.prefetched += len(longer.blocks) - len(cached.blocks)
        self.cache.unlock(longer.node)

    @staticmethod
    def lookup_tokens(seq: Sequence) -> list[int]:
        """The tokens whose cached prefix `seq` may read: all of them, or the first it may reuse and
        one more (the cache leaves the last token it is given uncached)."""
        tokens = seq.prompt_ids + seq.output_ids
        reusable = seq.reusable_len
        return tokens if reusable is None else tokens[: reusable + 1]

    def fork(self, seq: Sequence, parent: Sequence) -> CopyBlock | None:
        """Gives `seq` the blocks of `parent`, whose prefill of the same prompt is done: it shares
        those before the prompt's last token and gets its own copy of the one holding that token
        (returned, for the executor to make), so it computes that token again for its own logits
        and writes its own tokens after it. None, holding nothing, if blocks are short."""
        last = len(seq.prompt_ids) - 1
        shared = parent.blocks[: last // self.block_size]
        own = self._allocate(self._blocks_for(last + 2) - len(shared))
        if own is None:
            return None
        self.pool.retain(shared)
        seq.blocks, seq.cached = shared + own, NO_PREFIX
        seq.kv_generation = parent.kv_generation
        return CopyBlock(parent.blocks[len(shared)], own[0])

    def grow(self, seq: Sequence, num_tokens: int) -> list[int] | None:
        """Adds blocks until `seq` has room for `num_tokens`; returns those added (none if it had
        room), or None, adding nothing, if they cannot be had."""
        need = self._blocks_for(num_tokens) - len(seq.blocks)
        if need <= 0:
            return []
        blocks = self._allocate(need)
        if blocks is not None:
            seq.blocks += blocks
        return blocks

    def cache_prefill(self, seq: Sequence) -> None:
        """Stores the full blocks of a prefill that just completed, so requests admitted while this
        one still runs read them. Where the tree now holds this sequence's own blocks, it holds that
        longer prefix against eviction, as it held the matched one; where the tree kept blocks
        another request computed for the same tokens, this one goes on reading its own copies."""
        full = min(seq.prefill_done // self.block_size, len(seq.blocks))
        if full <= len(seq.cached.blocks) or seq.kv_generation != self.cache.generation:
            return
        tokens = seq.prefill_ids[: full * self.block_size]
        self.cache.insert(tokens, seq.blocks[:full], tenant=seq.tenant)
        self._write_through(seq, tokens, seq.blocks[:full])
        # match leaves the last token it is given uncached: give one past the stored blocks.
        stored = self.cache.match(tokens + [0], seq.tenant)
        if stored.blocks != seq.blocks[: len(stored.blocks)]:
            return
        self.cache.lock(stored.node)
        self.cache.unlock(seq.cached.node)
        seq.cached = stored

    def release(self, seq: Sequence) -> None:
        """Leaves the full blocks whose KV is computed to the cache, then drops the sequence's own
        references (so a block the cache already had for the same tokens is freed). Releasing a
        sequence that holds nothing does nothing: a finish that follows a drop."""
        if seq.cached is None:
            return
        if seq.kv_generation == self.cache.generation:
            full = min(seq.computed_len // self.block_size, len(seq.blocks))
            tokens = (seq.prompt_ids + seq.output_ids)[: full * self.block_size]
            self.cache.insert(tokens, seq.blocks[:full], tenant=seq.tenant)
            self._write_through(seq, tokens, seq.blocks[:full])
        self.cache.unlock(seq.cached.node)
        self.pool.release(seq.blocks)
        seq.blocks, seq.cached = [], None

    @staticmethod
    def forget(seq: Sequence) -> None:
        """A sequence whose KV went with another pool (an executor that is gone) holds nothing here."""
        seq.blocks, seq.cached = [], None

    def publish(self, tokens: list[int]) -> PrefixPublished:
        opened = self.cache.publish(tokens)
        return PrefixPublished(len(tokens) // self.block_size * self.block_size, opened)

    def flush(self) -> int:
        """Frees every cached block that no running request uses; returns how many."""
        return self.cache.flush()

    def flush_host(self) -> int:
        """Drops every block of the host tier (host_tier.py: HostTier.flush); returns how many."""
        return self.host.flush() if self.host is not None else 0

    def new_generation(self) -> int:
        """New weights: no cached KV is matched again, nor is the KV that running sequences
        computed so far ever cached; returns how many blocks were freed now (the rest go as
        their readers finish)."""
        freed = self.cache.new_generation()
        if self.host is not None:
            self.host.new_generation(self.cache.generation)
        return freed

    def saved(self, slots: list[int], abandoned: list[int]) -> None:
        """The executor reports these host saves done, or abandoned: their blocks are free of them."""
        if self.host is not None:
            self.pool.release(self.host.saved(slots) + self.host.unsaved(abandoned))

    def loaded(self, slots: list[int]) -> None:
        """The executor reports loads of these host slots made: no longer pinned for them."""
        if self.host is not None:
            self.host.loaded(slots)

    def _write_through(self, seq: Sequence, tokens: list[int], blocks: list[int]) -> None:
        """Asks the executor to copy to host slots the blocks just cached (`blocks`, the KV of
        `tokens`) that the host lacks; each keeps a pool reference until its copy is done."""
        if self.host is None or not blocks:
            return
        hashes = self.host.hashes(seq, tokens, len(blocks))
        saving, slots = self.host.to_save(hashes, blocks, tokens, self.host.root(seq))
        if saving:
            self.pool.retain(saving)
            self._commands.append(SaveBlocks(saving, slots))

    def _load_from_host(self, seq: Sequence, lookup: list[int], cached: MatchResult) -> MatchResult:
        """`cached`, locked, continued with the blocks after it that the host holds: they get GPU
        blocks, a LoadBlocks ahead of the sequence's start, and a place in the tree; returns the
        longer match, locked instead (or `cached` as it was, if nothing continues it)."""
        whole = (len(lookup) - 1) // self.block_size  # the blocks a match may cover: never the last token
        have = len(cached.blocks)
        if whole <= have:
            return cached
        hashes = self.host.hashes(seq, lookup, whole)
        slots = self.host.match(hashes[have:])
        blocks = self._allocate(len(slots)) if slots else None
        if blocks is None:
            return cached
        self._commands.append(LoadBlocks(slots, blocks))
        self.host.loading(slots)
        covered = (have + len(slots)) * self.block_size
        self.cache.insert(lookup[:covered], cached.blocks + blocks, tenant=seq.tenant)
        self.pool.release(blocks)  # the tree holds its own reference on those it stored
        longer = self.cache.match(lookup, seq.tenant)
        self.cache.lock(longer.node)
        self.cache.unlock(cached.node)
        return longer

    def _count_lookup(self, seq: Sequence, lookup: list[int], on_gpu: int, loaded: int) -> None:
        """A first lookup: the GPU had `on_gpu` blocks, and `loaded` more came through host slots,
        the last `seq.disk_blocks` of them from disk. Of the GPU's, those its fetch's pieces brought
        there (past what the GPU had when the fetch was asked) came through host slots too."""
        prefetched = min(seq.prefetched, max(on_gpu - seq.gpu_blocks_at_fetch, 0))
        on_gpu, loaded = on_gpu - prefetched, loaded + prefetched
        from_disk = min(loaded, seq.disk_blocks)
        served: list[tuple[TierName, int]] = [("gpu", on_gpu)]
        if self.host is not None:
            served.append(("host", loaded - from_disk))
        if self.disk is not None:
            served.append(("disk", from_disk))
        self.counts.record(max(len(lookup) - 1, 0) // self.block_size, served)

    def _allocate(self, count: int) -> list[int] | None:
        """Fresh blocks, evicting cached prefixes that no request uses if too few are free; None
        (and nothing evicted) if even that would not be enough."""
        short = count - self.pool.num_free
        if short > 0:
            if short > self.cache.stats().evictable_blocks:
                return None
            self.cache.evict(short)
            if self.pool.num_free < count:
                return None  # some evicted blocks were also the shared prompt of running choices
        return self.pool.allocate(count)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
