"""Requests an origin holds before they start: those that came while an actor on their path was
not ready (pipeline.py waits for it before encoding them). They count in flight, so the
concurrency limit sees them, and a client's abort reaches them: one aborted while held is not
submitted, and ends with finish_reason "abort" once it may go on.
"""

import asyncio
import time
from collections.abc import Callable

from kernel.tenants import may_abort
from schemas.errors import Error
from schemas.requests import Tenant

POLL_S = 0.05  # how often a held request looks at the actors' readiness


def describe(not_ready: dict[str, str]) -> str:
    """The actors not ready, each with why, as one line."""
    return "; ".join(f"{actor}: {reason}" for actor, reason in not_ready.items())


class HeldRequests:
    def __init__(self) -> None:
        self._tenants: dict[str, Tenant] = {}  # the client's request id -> its tenant
        self._aborted: set[str] = set()

    def __len__(self) -> int:
        return len(self._tenants)

    async def hold(
        self, request_id: str, tenant: Tenant, not_ready: Callable[[], dict[str, str]], wait_s: float
    ) -> Error | None:
        """Holds `request_id` while `not_ready()` names actors, at most `wait_s`; then None, or the
        retriable error that refuses it, naming them."""
        deadline = time.monotonic() + wait_s
        self._tenants[request_id] = tenant
        try:
            while reasons := not_ready():
                if time.monotonic() >= deadline:
                    return Error("unavailable", f"the server is not ready ({describe(reasons)}); retry", retriable=True)
                await asyncio.sleep(POLL_S)
        finally:
            del self._tenants[request_id]
        return None

    def abort(self, request_id: str, tenant: Tenant | None) -> bool:
        """Marks the held request `request_id` aborted, if `tenant` may (kernel/tenants.py)."""
        owner = self._tenants.get(request_id)
        if owner is None or not may_abort(tenant, owner):
            return False
        self._aborted.add(request_id)
        return True

    def abort_all(self, tenant: Tenant | None) -> list[str]:
        """Marks every held request that `tenant` may abort; returns their ids."""
        ids = [request_id for request_id, owner in self._tenants.items() if may_abort(tenant, owner)]
        self._aborted.update(ids)
        return ids

    def take_aborted(self, request_id: str) -> bool:
        """Whether `request_id` was aborted while held (asked once, after its hold)."""
        if request_id in self._aborted:
            self._aborted.discard(request_id)
            return True
        return False
