"""Which tenants may read a cached prefix. The radix cache (radix_cache.py) gives each node a
`Visibility`: private to the tenants that stored its tokens, public once `min_tenants` distinct
tenants sent them within a window, or once an admin published a prefix that covers them.
"""

from dataclasses import dataclass, field

Key = tuple[int, ...]


@dataclass
class Visibility:
    """Who may read one node of the tree."""

    public: bool = False  # every tenant may read it; never reverts
    owners: set[str] = field(default_factory=set)  # tenants that stored these tokens themselves
    senders: dict[str, float] = field(default_factory=dict)  # tenant -> when it last sent them; private only

    def visible_to(self, tenant: str) -> bool:
        return self.public or tenant in self.owners

    def copy(self) -> "Visibility":
        return Visibility(self.public, set(self.owners), dict(self.senders))


class Publication:
    """The rule that makes cached prefixes public, and the prefixes an admin published.

    A tenant sends a node's tokens when its request's tokens run through the node, whether it may
    read the node or not, and whether it looks them up or stores them. Once `min_tenants` distinct
    tenants did so within `window_s` of each other's latest send, the node is public. Only sends
    while the node is cached count: an evicted node forgets its senders.

    One object per scheduler, it outlives the trees: a cache rebuilt for a new executor (even of
    another block size) takes the same one and keeps what an admin published.
    """

    def __init__(self, min_tenants: int = 5, window_s: float = 3600.0) -> None:
        if min_tenants < 1:
            raise ValueError(f"min_tenants must be at least 1, not {min_tenants}")
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, not {window_s}")
        self.min_tenants = min_tenants
        self.window_s = window_s
        self._published: set[Key] = set()  # token prefixes, as given

    def sent(self, visibility: Visibility, tenant: str, now: float) -> bool:
        """Records that `tenant` sent the node's tokens at `now`; True if that made it public."""
        if visibility.public:
            return False
        senders = visibility.senders
        senders[tenant] = now
        for stale in [t for t, at in senders.items() if now - at > self.window_s]:
            del senders[stale]  # so a private node remembers fewer than min_tenants senders
        if len(senders) < self.min_tenants:
            return False
        visibility.public = True
        senders.clear()
        return True

    def publish(self, tokens: Key) -> None:
        """Every whole block of `tokens`, from the start, is public from now on."""
        self._published.add(tokens)

    def published_tokens(self, key: Key, block_size: int) -> int:
        """How many leading tokens of `key`, in whole blocks, an admin published."""
        longest, bs = 0, block_size
        for prefix in self._published:
            end = min(len(prefix), len(key)) // bs * bs
            same = 0
            while same < end and prefix[same : same + bs] == key[same : same + bs]:
                same += bs
            longest = max(longest, same)
        return longest
