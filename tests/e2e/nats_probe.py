"""A nats-py connection for tests that break the bus's rules on purpose and check what the server said."""

import asyncio

import nats

from kernel import bus_auth

PROBE = "bus-auth-probe"  # the name of these connections, so the nats-server log tells their violations apart


class Connection:
    """A nats-py connection that keeps the errors the server reported to it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc = None

    @classmethod
    async def open(cls, url: str, credentials: bus_auth.BusCredentials) -> "Connection":
        connection = cls()

        async def on_error(exc: Exception) -> None:
            connection.errors.append(str(exc))

        options = {"inbox_prefix": credentials.inbox_prefix} if credentials.inbox_prefix else {}
        connection.nc = await nats.connect(
            url,
            name=PROBE,
            user=credentials.user,
            password=credentials.password,
            error_cb=on_error,
            allow_reconnect=False,
            **options,
        )
        return connection

    async def settle(self) -> None:
        """A round trip to the server, so its answer to what we sent before has arrived."""
        await self.nc.flush(timeout=5)
        await asyncio.sleep(0.2)

    async def close(self) -> None:
        await self.nc.close()
