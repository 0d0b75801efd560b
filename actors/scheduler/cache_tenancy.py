"""Which tenants may read a cached prefix. The radix cache (radix_cache.py) keeps a `Visibility`
on each node and consults one `TenancyPolicy` on every read, lookup and store: the policy holds the
rule, and the prefixes an admin published.
"""

from dataclasses import dataclass, field

from schemas.requests import Tenant

Key = tuple[int, ...]


@dataclass
class Visibility:
    """Who may read one node of the tree: the state the policy keeps per node. A public node
    remembers no senders."""

    public: bool = False  # every tenant may read it; never reverts
    owners: set[Tenant] = field(default_factory=set)  # tenants that stored these tokens themselves
    senders: dict[str, float] = field(default_factory=dict)  # tenant name -> when it last sent them; private only

    def copy(self) -> "Visibility":
        return Visibility(self.public, set(self.owners), dict(self.senders))


class TenancyPolicy:
    """The rule of who reads what in the prefix cache.

    A node is private to its owners, the tenants that stored its tokens (each computed the same
    KV), each as narrowed by its `user` and its `cache_salt`. A salted tenant reads no public node
    and makes none public: its requests share KV only with requests of the same salt. A tenant sends a node's tokens when its request's tokens
    run through the node, whether it may read the node or not, and whether it looks them up or
    stores them. Once `min_tenants` distinct tenants did so within `window_s` of each other's
    latest send, the node is public. Senders count by name: the users of one API key are one
    tenant, or a single key could pose as the crowd that publication stands for (README, "Prefix
    cache and tenants").
    Only sends while the node is cached count: an evicted node forgets its senders. Every whole
    block of a prefix an admin published is public, cached now or later. Public never reverts.

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

    def may_read(self, visibility: Visibility, tenant: Tenant) -> bool:
        # A salted tenant reads only what it stored under the same salt.
        return (visibility.public and not tenant.cache_salt) or tenant in visibility.owners

    @staticmethod
    def owner_names(visibility: Visibility) -> set[str] | None:
        """The names of the tenants that may read the node, for reports; None when every tenant may."""
        return None if visibility.public else {tenant.name for tenant in visibility.owners}

    def sent(self, visibility: Visibility, tenant: Tenant, now: float) -> bool:
        """Records that `tenant` sent the node's tokens at `now`; True if that made it public. A
        salted tenant's sends do not count: what it sends stays its own."""
        if visibility.public or tenant.cache_salt:
            return False
        senders = visibility.senders
        senders[tenant.name] = now
        for stale in [t for t, at in senders.items() if now - at > self.window_s]:
            del senders[stale]  # so a private node remembers fewer than min_tenants senders
        if len(senders) < self.min_tenants:
            return False
        return self.open(visibility)

    def stored(self, visibility: Visibility, tenant: Tenant, now: float) -> bool:
        """`tenant` stored the node's tokens at `now`: it owns them, and sent them; True if that
        made the node public."""
        visibility.owners.add(tenant)
        return self.sent(visibility, tenant, now)

    def open(self, visibility: Visibility) -> bool:
        """Makes the node public; False if it was already."""
        if visibility.public:
            return False
        visibility.public = True
        visibility.senders.clear()
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
