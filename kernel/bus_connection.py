"""The bus's one connection to nats-server: who it logs in as, how it keeps reconnecting when the
server goes away, and how it ends. kernel/bus.py opens it and sends everything through it.
"""

from collections.abc import Awaitable, Callable

import nats
import nats.errors
import structlog
from nats.aio.client import Client

from kernel.bus_auth import BusCredentials

log = structlog.get_logger()


async def open_connection(
    url: str, name: str, credentials: BusCredentials | None, on_reconnect: Callable[[], Awaitable[None]]
) -> Client:
    """Connects (as the user of `credentials`, if given), and keeps reconnecting forever if the
    server goes away, calling `on_reconnect` after each reconnection."""
    auth = {}
    if credentials is not None:
        auth = {"user": credentials.user, "password": credentials.password}
        if credentials.inbox_prefix:
            auth["inbox_prefix"] = credentials.inbox_prefix  # the only inboxes this user may read

    async def on_error(exc: Exception) -> None:
        log.warning("bus_error", error=repr(exc))

    client: Client | None = None

    async def on_disconnect() -> None:
        if client is not None and client.is_closed:
            return  # closed by us (close_connection), not lost: nothing to warn of
        log.warning("bus_disconnected")

    async def on_reconnected() -> None:
        log.info("bus_reconnected")
        await on_reconnect()

    client = await nats.connect(
        url,
        name=name,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,
        connect_timeout=2,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnected,
        **auth,
    )
    return client


async def close_connection(nc: Client) -> None:
    """Drains the connection (what was published goes out, subscriptions finish their messages),
    or closes it at once where draining fails. Closing it again does nothing."""
    if nc.is_closed:
        return
    try:
        await nc.drain()
    except (TimeoutError, nats.errors.Error):
        await nc.close()
