"""The shape of the radix cache's tree (radix_cache.py): its nodes, what a match returns, and the
walk down a key, which splits a node where the key leaves it or ends inside it."""

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from actors.scheduler.cache_tenancy import Key, Visibility


@dataclass(eq=False)
class Node:
    """An edge of the tree: `key` holds a whole number of blocks of tokens, `blocks` their KV."""

    key: Key
    blocks: list[int]
    parent: "Node | None"
    children: dict[Key, "Node"] = field(default_factory=dict)  # by the tokens of the child's first block
    lock_ref: int = 0  # running requests whose matched prefix runs through this node
    last_access: int = 0  # a tick of the cache's counter: LRU among nodes of equal hits
    visibility: Visibility = field(default_factory=Visibility)  # what the tenancy policy knows of it
    hits: float = 0.0  # requests that read it, each worth half as much every half-life since...
    hits_at: float = 0.0  # ...this time, when `hits` was last brought up to date


class MatchResult(NamedTuple):
    """A cached prefix. `node` is where the match ends: lock it before anything may evict, and
    unlock it once the request no longer reads `blocks`."""

    node: Node
    blocks: list[int]
    num_tokens: int  # len(blocks) * block_size


def descend(node: Node, key: Key, block_size: int) -> Iterator[tuple[Node, int]]:
    """The nodes under `node` along `key`, split where `key` ends or leaves them, each with how
    many tokens of `key` it ends at. A split changes no block and no token a node stands for."""
    pos = 0
    while pos < len(key) and (child := node.children.get(key[pos : pos + block_size])) is not None:
        same = _same_blocks(child, key, pos, block_size)
        if same < len(child.blocks):
            child = split(child, same, block_size)
        pos += same * block_size
        yield child, pos
        node = child


def split(node: Node, num_blocks: int, block_size: int) -> Node:
    """Cuts `node` after `num_blocks` blocks; returns the new upper part. The lower part stays
    `node`, so a lock held through it still covers both."""
    bs = block_size
    upper = Node(
        node.key[: num_blocks * bs],
        node.blocks[:num_blocks],
        node.parent,
        lock_ref=node.lock_ref,
        last_access=node.last_access,
        visibility=node.visibility.copy(),
        hits=node.hits,
        hits_at=node.hits_at,
    )
    node.parent.children[upper.key[:bs]] = upper
    node.key, node.blocks, node.parent = node.key[num_blocks * bs :], node.blocks[num_blocks:], upper
    upper.children[node.key[:bs]] = node
    return upper


def _same_blocks(node: Node, key: Key, pos: int, block_size: int) -> int:
    """How many leading blocks of `node` hold the tokens of `key` from `pos` (at least one: the
    child was found by its first block)."""
    bs = block_size
    most = min(len(node.blocks), (len(key) - pos) // bs)
    # Usually all of them: one comparison of the whole run (a long prompt's hit walks hundreds of
    # blocks), then block by block only to find where a key leaves the node.
    if node.key[bs : most * bs] == key[pos + bs : pos + most * bs]:
        return most
    same = 1
    while node.key[same * bs : (same + 1) * bs] == key[pos + same * bs : pos + (same + 1) * bs]:
        same += 1
    return same
