"""Cached KV prefixes shared between requests: a radix tree over full KV blocks (RadixAttention).

The scheduler owns it beside the block pool. Finished, aborted and preempted requests leave their
computed full blocks here; a new request takes the longest cached prefix of its tokens and
computes only the rest. Its keys belong to one generation of weights: new weights start a new
generation (a fresh tree), and KV computed under the old ones is never matched again. Which
tenants read a node is the tenancy policy's rule (cache_tenancy.py), which the tree consults; the
nodes and the walk down a key are in radix_node.py.
"""

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from actors.scheduler.block_pool import BlockPool
from actors.scheduler.cache_tenancy import Key, TenancyPolicy
from actors.scheduler.radix_node import MatchResult, Node, descend, split
from schemas.requests import Tenant


class CacheStats(NamedTuple):
    cached_blocks: int  # held by the tree, whether requests also use them or not
    evictable_blocks: int  # held by the tree only: eviction would free them
    hit_tokens: int  # over every match: tokens served from the cache
    queried_tokens: int  # over every match: tokens looked up


class CacheUsage(NamedTuple):
    """What GET /admin/cache shows; costs a walk of the tree."""

    free_blocks: int  # in the pool: held by nobody
    cached_blocks: int  # held by the tree
    evictable_blocks: int  # held by the tree and read by no running request
    locked_blocks: int  # held by the tree and read by running requests
    public_blocks: int  # cached, readable by every tenant
    private_blocks: dict[str, int]  # tenant name -> its cached blocks not public (one of two tenants counts for both)
    hit_tokens: int
    queried_tokens: int


class RadixCache:
    """Full KV blocks keyed by the tokens of the whole prefix up to them, each node readable by
    the tenants that `tenancy` lets read it.

    Invariants: the tree holds exactly one `BlockPool` reference for every block it stores, and a
    block appears in at most one node, whichever tenants read it. A stored block is full and
    read-only. A locked node and its ancestors are never evicted. What a tenant may read is a
    prefix of every path (a public node's ancestors are public; an owner owns the ancestors too),
    so a match stops at the first node it may not read. Only `record_lookup` counts hits and
    sends; `match` only reads. Disabled, it matches nothing and stores nothing.

    Eviction takes the unlocked leaves with the fewest hits first, each hit worth half as much
    every `hit_half_life_s`; `clock` gives those times and the tenancy window's.

    `generation` counts the weights the keys belong to (`new_generation`). The trees of earlier
    generations are reachable only through the locks on them; each of their nodes is freed as
    soon as no lock holds it, and nothing is ever stored in them again.
    """

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        enabled: bool = True,
        *,
        tenancy: TenancyPolicy | None = None,
        hit_half_life_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if hit_half_life_s <= 0:
            raise ValueError(f"hit_half_life_s must be positive, not {hit_half_life_s}")
        self.pool = pool
        self.block_size = block_size
        self.enabled = enabled
        self.tenancy = tenancy if tenancy is not None else TenancyPolicy()
        self.hit_half_life_s = hit_half_life_s
        self._clock = clock
        self._root = Node((), [], None)
        self.generation = 0
        self._leaves: set[Node] = set()  # the evictable ones: unlocked, with no children
        self._ticks = itertools.count(1)
        self._evictable = 0
        self._locked = 0
        self._hit_tokens = 0
        self._queried_tokens = 0

    def match(self, tokens: list[int], tenant: Tenant = Tenant()) -> MatchResult:
        """The longest cached prefix of `tokens` that `tenant` may read, in whole blocks, leaving
        at least one token uncached so that computing the rest yields the last position's logits.

        A read: no hit, no send, no visibility changes. Where the prefix ends inside a node, that
        node is split, so that the match ends on a node that locks exactly its blocks.
        """
        node, blocks, readable = self._root, [], True
        if not self.enabled:
            return MatchResult(node, blocks, 0)
        for child, _ in descend(self._root, self._lookup_key(tokens), self.block_size):
            readable = readable and self.tenancy.may_read(child.visibility, tenant)
            if readable:
                node, blocks = child, blocks + child.blocks
        return MatchResult(node, blocks, len(blocks) * self.block_size)

    def record_lookup(self, tokens: list[int], tenant: Tenant = Tenant()) -> None:
        """Counts one request's lookup of `tokens`: `tenant` sends every cached node along them,
        readable or not, and each node it may read gets a hit; the hit rate counts the tokens.

        Call it once per request, before its `match`, so that the request whose send makes a
        node public reads it already. A session finding the KV to pin, or a request matched again
        after waiting for blocks, records nothing: eviction and the hit rate weigh only what
        requests read.
        """
        if not self.enabled:
            return
        tick, now = next(self._ticks), self._clock()
        hit, readable = 0, True
        for child, end in descend(self._root, self._lookup_key(tokens), self.block_size):
            if self.tenancy.sent(child.visibility, tenant, now):
                self._make_public(child.parent)  # see _stored
            readable = readable and self.tenancy.may_read(child.visibility, tenant)
            if readable:
                child.last_access = tick
                child.hits, child.hits_at = self._score(child, now) + 1, now
                hit = end
        self._queried_tokens += len(tokens)
        self._hit_tokens += hit

    def insert(self, tokens: list[int], blocks: list[int], tenant: Tenant = Tenant()) -> int:
        """Stores the full blocks `blocks` holding the KV of `tokens` (block_size tokens each) for
        `tenant`, who owns them from now on, and returns how many the tree did not have. Where the
        tree already has a block for the same tokens it keeps its own, even one `tenant` could not
        read (which it now owns: it computed the same KV); the caller still holds, and releases,
        its references to all of `blocks`: the tree takes its own on those it stores."""
        bs = self.block_size
        if len(tokens) != len(blocks) * bs:
            raise ValueError(f"{len(tokens)} tokens do not fill {len(blocks)} blocks of {bs}")
        if not self.enabled or not blocks:
            return 0
        key, tick, now = tuple(tokens), next(self._ticks), self._clock()
        node, pos = self._root, 0
        for node, pos in descend(self._root, key, self.block_size):  # noqa: B007 (pos is read after the loop)
            node.last_access = tick
            self._stored(node, tenant, now)
        if pos == len(key):
            return 0
        new_blocks = blocks[pos // bs :]
        leaf = Node(key[pos:], new_blocks, node, last_access=tick, hits=1.0, hits_at=now)
        node.children[key[pos : pos + bs]] = leaf
        self._leaves.discard(node)
        self._leaves.add(leaf)
        self.pool.retain(new_blocks)
        self._evictable += len(new_blocks)
        self._stored(leaf, tenant, now)
        published = (self.tenancy.published_tokens(key, bs) - pos) // bs
        if published > 0:
            self._make_public(split(leaf, published, bs) if published < len(new_blocks) else leaf)
        return len(new_blocks)

    def publish(self, tokens: list[int]) -> int:
        """Makes every whole block of `tokens`, from the start, public: the cached ones now, and
        those stored later (a shared system prompt). Returns how many cached blocks it opened."""
        if not self.enabled:
            return 0
        self.tenancy.publish(tuple(tokens))
        key = tuple(tokens[: len(tokens) // self.block_size * self.block_size])
        node = self._root
        for node, _ in descend(self._root, key, self.block_size):  # noqa: B007 (node is read after the loop)
            pass  # down to the node that ends where the published tokens leave the tree
        return self._make_public(node)

    def lock(self, node: Node) -> None:
        """Protects `node` and its ancestors from eviction: one lock per request reading them."""
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.blocks)
                self._locked += len(node.blocks)
                self._leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        locked = node
        while node.parent is not None:
            if node.lock_ref == 0:
                raise ValueError("unlocking a cached prefix that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.blocks)
                self._locked -= len(node.blocks)
                if not node.children:
                    self._leaves.add(node)
            node = node.parent
        if node is not self._root:
            self._free_stale(locked)

    def evict(self, num_blocks: int) -> int:
        """Frees at least `num_blocks` blocks if it can, unlocked leaves with the fewest decayed
        hits first, least recently used among equals (whole nodes, so maybe a few more); returns
        how many it freed."""
        if num_blocks <= 0:
            return 0
        tie, now = itertools.count(), self._clock()
        leaves = [(self._score(n, now), n.last_access, next(tie), n) for n in self._leaves]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_blocks and leaves:
            *_, node = heapq.heappop(leaves)
            parent = node.parent
            del parent.children[node.key[: self.block_size]]
            self._leaves.remove(node)
            self.pool.release(node.blocks)
            self._evictable -= len(node.blocks)
            freed += len(node.blocks)
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                self._leaves.add(parent)
                heapq.heappush(leaves, (self._score(parent, now), parent.last_access, next(tie), parent))
        return freed

    def flush(self) -> int:
        """Drops every block no request uses (after a weight update, say); returns how many."""
        return self.evict(self._evictable)

    def new_generation(self) -> int:
        """Starts the keys of new weights: no match finds a block cached so far. The blocks no
        request reads are freed now (returns how many); the locked ones as their last reader
        unlocks them (`unlock`), while the old tree, out of every match's reach, holds them."""
        freed = self.flush()
        self.generation += 1
        self._root = Node((), [], None)
        return freed

    def stats(self) -> CacheStats:
        return CacheStats(self._evictable + self._locked, self._evictable, self._hit_tokens, self._queried_tokens)

    def usage(self) -> CacheUsage:
        public, private = 0, Counter()
        for node in self._nodes():
            names = self.tenancy.owner_names(node.visibility)
            if names is None:
                public += len(node.blocks)
            for name in names or ():
                private[name] += len(node.blocks)
        return CacheUsage(
            self.pool.num_free,
            self._evictable + self._locked,
            self._evictable,
            self._locked,
            public,
            dict(private),
            self._hit_tokens,
            self._queried_tokens,
        )

    def cached_blocks(self) -> list[int]:
        """Every block the tree holds."""
        return [b for node in self._nodes() for b in node.blocks]

    def _nodes(self) -> list[Node]:
        stack = [self._root]
        nodes = []
        while stack:
            node = stack.pop()
            stack += node.children.values()
            if node.parent is not None:
                nodes.append(node)
        return nodes

    def _free_stale(self, node: Node) -> None:
        """Frees `node`, of an earlier generation's tree, and then its ancestors, while each is an
        unlocked leaf: no match can reach them, so nothing else would."""
        while node.parent is not None and node.lock_ref == 0 and not node.children:
            del node.parent.children[node.key[: self.block_size]]
            self._leaves.discard(node)
            self.pool.release(node.blocks)
            self._evictable -= len(node.blocks)
            node = node.parent

    def _lookup_key(self, tokens: list[int]) -> Key:
        """The whole blocks of `tokens` a match may cover: never the last token."""
        return tuple(tokens[: (len(tokens) - 1) // self.block_size * self.block_size])

    def _stored(self, node: Node, tenant: Tenant, now: float) -> None:
        if self.tenancy.stored(node.visibility, tenant, now):
            self._make_public(node.parent)  # public already, or due: they saw every sender of `node`

    def _make_public(self, node: Node) -> int:
        """Makes `node` and its ancestors public; returns how many blocks were private. An
        ancestor of a public node is public, so the walk stops at the first one."""
        opened = 0
        while node.parent is not None and self.tenancy.open(node.visibility):
            opened += len(node.blocks)
            node = node.parent
        return opened

    def _score(self, node: Node, now: float) -> float:
        return node.hits * 0.5 ** ((now - node.hits_at) / self.hit_half_life_s)
