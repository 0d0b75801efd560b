"""Cached KV prefixes shared between requests: a radix tree over full KV blocks (RadixAttention).

The scheduler owns it beside the block pool. Finished, aborted and preempted requests leave their
computed full blocks here; a new request takes the longest cached prefix of its tokens and
computes only the rest. One tree per namespace, so requests share KV only within one.
"""

import heapq
import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

from actors.scheduler.block_pool import BlockPool

Key = tuple[int, ...]


@dataclass(eq=False)
class Node:
    """An edge of the tree: `key` holds a whole number of blocks of tokens, `blocks` their KV."""

    key: Key
    blocks: list[int]
    parent: "Node | None"
    children: dict[Key, "Node"] = field(default_factory=dict)  # by the tokens of the child's first block
    lock_ref: int = 0  # running requests whose matched prefix runs through this node
    last_access: int = 0  # a tick of the cache's clock, for LRU eviction


class MatchResult(NamedTuple):
    """A cached prefix. `node` is where the match ends: lock it before anything may evict, and
    unlock it once the request no longer reads `blocks`."""

    node: Node
    blocks: list[int]
    num_tokens: int  # len(blocks) * block_size


class CacheStats(NamedTuple):
    cached_blocks: int  # held by the tree, whether requests also use them or not
    evictable_blocks: int  # held by the tree only: eviction would free them
    hit_tokens: int  # over every match: tokens served from the cache
    queried_tokens: int  # over every match: tokens looked up


class RadixCache:
    """Full KV blocks keyed by (namespace, the tokens of the whole prefix up to them).

    Invariants: the tree holds exactly one `BlockPool` reference for every block it stores, and a
    block appears in at most one node. A stored block is full and read-only. A locked node and its
    ancestors are never evicted. Disabled, it matches nothing and stores nothing.
    """

    def __init__(self, pool: BlockPool, block_size: int, enabled: bool = True) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enabled = enabled
        self._roots: dict[str, Node] = {}
        self._nowhere = Node((), [], None)  # the match of a namespace with no tree
        self._leaves: set[Node] = set()  # the evictable ones: unlocked, with no children
        self._clock = itertools.count(1)
        self._evictable = 0
        self._locked = 0
        self._hit_tokens = 0
        self._queried_tokens = 0

    def match(self, namespace: str, tokens: list[int]) -> MatchResult:
        """The longest cached prefix of `tokens`, in whole blocks, leaving at least one token
        uncached so that computing the rest yields the last position's logits."""
        if not self.enabled:
            return MatchResult(self._nowhere, [], 0)
        self._queried_tokens += len(tokens)
        root = self._roots.get(namespace)
        if root is None:
            return MatchResult(self._nowhere, [], 0)
        bs, now = self.block_size, next(self._clock)
        key = tuple(tokens[: (len(tokens) - 1) // bs * bs])
        node, pos, blocks = root, 0, []
        node.last_access = now
        while pos < len(key) and (child := node.children.get(key[pos : pos + bs])) is not None:
            same = self._same_blocks(child, key, pos)
            if same < len(child.blocks):
                child = self._split(child, same)
            child.last_access = now
            blocks += child.blocks
            pos += same * bs
            node = child
        self._hit_tokens += pos
        return MatchResult(node, blocks, pos)

    def insert(self, namespace: str, tokens: list[int], blocks: list[int]) -> int:
        """Stores the full blocks `blocks` holding the KV of `tokens` (block_size tokens each) and
        returns how many the tree did not have. Where the tree already has a block for the same
        tokens it keeps its own; the caller still holds, and releases, its references to all of
        `blocks`: the tree takes its own on those it stores."""
        bs = self.block_size
        if len(tokens) != len(blocks) * bs:
            raise ValueError(f"{len(tokens)} tokens do not fill {len(blocks)} blocks of {bs}")
        if not self.enabled or not blocks:
            return 0
        key, now = tuple(tokens), next(self._clock)
        node = self._roots.setdefault(namespace, Node((), [], None))
        node.last_access = now
        pos = 0
        while pos < len(key):
            child = node.children.get(key[pos : pos + bs])
            if child is None:
                new_blocks = blocks[pos // bs :]
                leaf = node.children[key[pos : pos + bs]] = Node(key[pos:], new_blocks, node, last_access=now)
                self._leaves.discard(node)
                self._leaves.add(leaf)
                self.pool.retain(new_blocks)
                self._evictable += len(new_blocks)
                return len(new_blocks)
            same = self._same_blocks(child, key, pos)
            if same < len(child.blocks):
                child = self._split(child, same)
            child.last_access = now
            pos += same * bs
            node = child
        return 0

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

    def evict(self, num_blocks: int) -> int:
        """Frees at least `num_blocks` blocks if it can, least recently used unlocked leaves first
        (whole nodes, so maybe a few more); returns how many it freed."""
        if num_blocks <= 0:
            return 0
        tie = itertools.count()
        leaves = [(n.last_access, next(tie), n) for n in self._leaves]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_blocks and leaves:
            _, _, node = heapq.heappop(leaves)
            parent = node.parent
            del parent.children[node.key[: self.block_size]]
            self._leaves.remove(node)
            self.pool.release(node.blocks)
            self._evictable -= len(node.blocks)
            freed += len(node.blocks)
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                self._leaves.add(parent)
                heapq.heappush(leaves, (parent.last_access, next(tie), parent))
        if freed:
            self._roots = {ns: root for ns, root in self._roots.items() if root.children}
        return freed

    def flush(self) -> int:
        """Drops every block no request uses (after a weight update, say); returns how many."""
        return self.evict(self._evictable)

    def stats(self) -> CacheStats:
        return CacheStats(self._evictable + self._locked, self._evictable, self._hit_tokens, self._queried_tokens)

    def cached_blocks(self) -> list[int]:
        """Every block the tree holds."""
        return [b for node in self._nodes() for b in node.blocks]

    def _nodes(self) -> list[Node]:
        stack = list(self._roots.values())
        nodes = []
        while stack:
            node = stack.pop()
            stack += node.children.values()
            if node.parent is not None:
                nodes.append(node)
        return nodes

    def _same_blocks(self, node: Node, key: Key, pos: int) -> int:
        """How many leading blocks of `node` hold the tokens of `key` from `pos` (at least one: the
        child was found by its first block)."""
        bs = self.block_size
        same = 1
        while same < len(node.blocks) and pos + (same + 1) * bs <= len(key):
            if node.key[same * bs : (same + 1) * bs] != key[pos + same * bs : pos + (same + 1) * bs]:
                break
            same += 1
        return same

    def _split(self, node: Node, num_blocks: int) -> Node:
        """Cuts `node` after `num_blocks` blocks; returns the new upper part. The lower part stays
        `node`, so a lock held through it still covers both."""
        bs = self.block_size
        upper = Node(node.key[: num_blocks * bs], node.blocks[:num_blocks], node.parent,
                     lock_ref=node.lock_ref, last_access=node.last_access)
        node.parent.children[upper.key[:bs]] = upper
        node.key, node.blocks, node.parent = node.key[num_blocks * bs :], node.blocks[num_blocks:], upper
        upper.children[node.key[:bs]] = node
        return upper
