"""The receiving side of the bus: each subscription decodes its messages into one type, calls its
handler in order and sends back what the handler returns; a message that does not decode, or a
handler that raises, gets an `Error` reply instead. kernel/bus.py owns one `Subscriptions` per
connection, and each subscription is an endpoint of the process's NATS micro service
(kernel/bus_service.py), with its counts.
"""

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client

from kernel.bus_codec import decode, field_at_fault
from kernel.bus_service import Endpoint
from schemas.errors import Error

log = structlog.get_logger()

# A handler gets the decoded message and the reply subject (None for plain publishes); what it
# returns, if anything, is sent back as the reply.
Handler = Callable[[Any, str | None], Awaitable[msgspec.Struct | None]]
TokenHandler = Callable[[Any, str | None, str], Awaitable[msgspec.Struct | None]]  # and the subject's last token


class BusUnavailable(Exception):
    """The bus is disconnected or closed, so a subscription cannot be made now."""


class Subscription:
    def __init__(self, nats_subscription, endpoint: Endpoint, endpoints: list[Endpoint]) -> None:
        self._sub = nats_subscription
        self._endpoint = endpoint
        self._endpoints = endpoints

    async def close(self) -> None:
        if self._endpoint in self._endpoints:
            self._endpoints.remove(self._endpoint)
        try:
            await self._sub.unsubscribe()
        except nats.errors.Error:
            pass  # the connection is already gone, and the subscription with it


class Subscriptions:
    """Every subscription of one connection. Answers go out through `reply` (the bus's, which turns
    one too large for the bus into an `Error`), and each message received through `note_traffic`."""

    def __init__(
        self,
        nc: Client,
        reply: Callable[[str, msgspec.Struct], Awaitable[None]],
        note_traffic: Callable[[msgspec.Struct], None],
    ) -> None:
        self._nc = nc
        self._reply = reply
        self._note_traffic = note_traffic
        self.endpoints: list[Endpoint] = []  # one per subscription, in the order they were made

    async def add(
        self,
        subject: str,
        message_type: Any,
        call: Callable[[Any, str | None, str], Awaitable[msgspec.Struct | None]],
        queue: str,
    ) -> Subscription:
        """`call` gets the message, the reply subject and the subject it came on. When this returns,
        the server has the subscription (kernel/bus.py's `Bus.subscribe` says why that matters);
        `BusUnavailable` if it could not be made or confirmed."""

        endpoint = Endpoint(subject, queue, message_type)

        async def on_message(msg) -> None:
            started_ns = time.perf_counter_ns()
            reply_to = msg.reply or None
            try:
                message = decode(msg.data, message_type)
            except msgspec.DecodeError as exc:
                log.warning("undecodable_message", subject=subject, error=str(exc))
                await self._answer(
                    reply_to, Error("invalid_request", f"could not decode message: {exc}", param=field_at_fault(exc))
                )
                endpoint.record(started_ns, f"could not decode message: {exc}")
                return
            self._note_traffic(message)
            try:
                result = await call(message, reply_to, msg.subject)
            except Exception as exc:
                log.exception("handler_failed", subject=subject)
                await self._answer(reply_to, Error("internal", f"{type(exc).__name__}: {exc}", retriable=True))
                endpoint.record(started_ns, f"{type(exc).__name__}: {exc}")
                return
            if result is not None:
                await self._answer(reply_to, result)
            endpoint.record(started_ns, result.message if type(result) is Error else None)

        try:
            nats_subscription = await self._nc.subscribe(subject, queue=queue, cb=on_message)
        except nats.errors.Error as exc:
            raise BusUnavailable(f"cannot subscribe to {subject}: {exc}") from exc
        self.endpoints.append(endpoint)
        subscription = Subscription(nats_subscription, endpoint, self.endpoints)
        try:
            # nats-py writes a flush's PING to the socket at once, while the SUB waits in its buffer for
            # the flusher task, so the first PONG may come before the server has the SUB. The flusher
            # has run by the time that PONG is back: the second PING follows the SUB.
            for _ in range(2):
                await self._nc.flush()
        except (TimeoutError, nats.errors.Error) as exc:
            await subscription.close()  # else the client would restore it on reconnecting, unknown to the caller
            raise BusUnavailable(f"the server did not confirm the subscription to {subject}: {exc}") from exc
        return subscription

    async def _answer(self, reply_to: str | None, message: msgspec.Struct) -> None:
        if reply_to:
            await self._reply(reply_to, message)
