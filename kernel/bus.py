"""The only module that touches nats-py: typed publish, request and subscribe over msgpack.

Actors hand it msgspec Structs and get Structs back. Anything that goes wrong on the wire (a
message that does not decode, no responder, a timeout) comes back as a typed `Error`, never as
a nats exception, so callers handle one kind of failure; a subscription the server cannot confirm
raises `BusUnavailable`. Each subscription is also an endpoint of the process's NATS micro service
(kernel/bus_service.py), with its counts.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec
import nats
import nats.errors
import structlog

from kernel.bus_auth import BusCredentials
from kernel.bus_service import Endpoint, start_service
from kernel.busy_poll import BusyPoll
from schemas.errors import Error
from schemas.health import Heartbeat

log = structlog.get_logger()

# A handler gets the decoded message and the reply subject (None for plain publishes); what it
# returns, if anything, is sent back as the reply.
Handler = Callable[[Any, str | None], Awaitable[msgspec.Struct | None]]
TokenHandler = Callable[[Any, str | None, str], Awaitable[msgspec.Struct | None]]  # and the subject's last token

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes, message_type: Any) -> Any:
    decoder = _decoders.get(message_type)
    if decoder is None:
        decoder = _decoders[message_type] = msgspec.msgpack.Decoder(message_type)
    return decoder.decode(data)


def field_at_fault(exc: msgspec.DecodeError) -> str | None:
    """The field that msgspec's complaint ends with ("... - at `$.params.top_p`"): "params.top_p"."""
    _, _, path = str(exc).partition(" - at `$")
    return path.rstrip("`").lstrip(".") or None


class BusUnavailable(Exception):
    """The bus is disconnected or closed, so a subscription cannot be made now."""


class PayloadTooLarge(Exception):
    """A message over the server's payload limit (nats-server's `max_payload`, 1 MB by default),
    which NATS refuses whole: nothing was sent."""

    def __init__(self, message: msgspec.Struct, subject: str, size: int, limit: int) -> None:
        super().__init__(
            f"{type(message).__name__} of {size} bytes on {subject} is over the bus's max_payload of "
            f"{limit} (--bus-max-payload-bytes for the embedded server)"
        )


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


class Bus:
    def __init__(self) -> None:
        self._nc = None
        self._reconnect_listeners: list[Callable[[], Awaitable[None]]] = []
        self._busy_poll: BusyPoll | None = None
        self._endpoints: list[Endpoint] = []  # one per subscription, in the order they were made

    @classmethod
    async def connect(cls, url: str, name: str, credentials: BusCredentials | None = None) -> "Bus":
        """Connects (as the user of `credentials`, if given), and keeps reconnecting forever if
        the server goes away."""
        bus = cls()
        auth = {}
        if credentials is not None:
            auth = {"user": credentials.user, "password": credentials.password}
            if credentials.inbox_prefix:
                auth["inbox_prefix"] = credentials.inbox_prefix  # the only inboxes this user may read

        async def on_error(exc: Exception) -> None:
            log.warning("bus_error", error=repr(exc))

        async def on_disconnect() -> None:
            log.warning("bus_disconnected")

        async def on_reconnect() -> None:
            log.info("bus_reconnected")
            for listener in bus._reconnect_listeners:
                await listener()

        bus._nc = await nats.connect(
            url,
            name=name,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            connect_timeout=2,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            **auth,
        )
        return bus

    def on_reconnect(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Calls `listener` after each reconnection. Core NATS delivers at most once, so messages
        published while the connection was down may be lost in either direction: a listener
        resynchronises whatever state depends on them. It must return quickly (spawn long work)."""
        self._reconnect_listeners.append(listener)

    def poll_after_traffic(self, window_s: float) -> Coroutine:
        """The task that keeps this process's loop polling for `window_s` after each message sent or
        received, heartbeats aside, and after each request answered (`kernel.busy_poll` says why)."""
        self._busy_poll = BusyPoll(window_s)
        return self._busy_poll.run()

    def _note_traffic(self, message: msgspec.Struct) -> None:
        if self._busy_poll is not None and type(message) is not Heartbeat:
            self._busy_poll.note_traffic()

    @property
    def connected(self) -> bool:
        return self._nc.is_connected

    def new_inbox(self) -> str:
        return self._nc.new_inbox()

    @property
    def max_payload_bytes(self) -> int:
        """The largest message the server takes."""
        return self._nc.max_payload

    def _encode_within_limit(self, subject: str, message: msgspec.Struct, limit_bytes: int | None = None) -> bytes:
        data = encode(message)
        limit = self._nc.max_payload if limit_bytes is None else min(limit_bytes, self._nc.max_payload)
        if len(data) > limit:
            raise PayloadTooLarge(message, subject, len(data), limit)
        return data

    async def publish(self, subject: str, message: msgspec.Struct, limit_bytes: int | None = None) -> None:
        """Raises `PayloadTooLarge` for a message the server would refuse, or one over `limit_bytes`."""
        self._note_traffic(message)
        await self._nc.publish(subject, self._encode_within_limit(subject, message, limit_bytes))

    async def publish_in_parts(
        self,
        subject: str,
        items: list,
        message: Callable[[list, bool], msgspec.Struct],
        limit_bytes: int | None = None,
        halves: Callable[[Any], tuple[Any, Any] | None] | None = None,
    ) -> int:
        """Publishes `message(items, last)` in one message if it fits, else the items halved, in
        order, until each part does; `last` is True for the part that ends the list. An item alone
        too large is cut by `halves` (two items saying the same in turn; None: it cannot be), or
        raises `PayloadTooLarge`. Returns the messages it took."""
        return await self._publish_part(subject, items, True, message, limit_bytes, halves)

    async def _publish_part(self, subject, items, last, message, limit_bytes, halves) -> int:
        try:
            await self.publish(subject, message(items, last), limit_bytes)
            return 1
        except PayloadTooLarge:
            if len(items) > 1:
                middle = len(items) // 2
                parts = items[:middle], items[middle:]
            elif items and halves is not None and (cut := halves(items[0])) is not None:
                parts = [cut[0]], [cut[1]]
            else:
                raise
        first = await self._publish_part(subject, parts[0], False, message, limit_bytes, halves)
        return first + await self._publish_part(subject, parts[1], last, message, limit_bytes, halves)

    async def request(self, subject: str, message: msgspec.Struct, reply_type: Any, timeout_s: float) -> Any:
        """Sends `message` and returns the decoded reply, or an `Error`."""
        try:
            data = self._encode_within_limit(subject, message)
        except PayloadTooLarge as exc:
            return Error("invalid_request", f"too large to cross the server's bus: {exc}")
        try:
            reply = await self._nc.request(subject, data, timeout=timeout_s)
        except nats.errors.NoRespondersError:
            return Error("unavailable", f"nothing is listening on {subject}", retriable=True)
        except nats.errors.TimeoutError:
            return Error("timeout", f"no reply on {subject} within {timeout_s} s", retriable=True)
        except nats.errors.ConnectionClosedError:
            return Error("unavailable", "the bus connection is closed", retriable=True)
        try:
            answer = decode(reply.data, reply_type | Error)
        except msgspec.DecodeError as exc:
            return Error("internal", f"undecodable reply on {subject}: {exc}")
        self._note_traffic(answer)
        return answer

    async def subscribe(self, subject: str, message_type: Any, handler: Handler, queue: str = "") -> Subscription:
        """Calls `handler` for each message, in order. Undecodable messages get an `Error` reply.
        When it returns, the server has the subscription: what any client publishes after that
        reaches `handler` (without the round trip, a message sent on another connection could
        overtake it and be dropped).

        A handler that raises gets an `internal` Error sent back and the exception logged; the
        subscription keeps serving, since one bad message must not stop the others.
        """
        return await self._subscribe(
            subject, message_type, lambda message, reply_to, _subject: handler(message, reply_to), queue
        )

    async def subscribe_under(
        self, subject: str, message_type: Any, handler: TokenHandler, queue: str = ""
    ) -> Subscription:
        """As `subscribe`, to every subject one token below `subject` (`<subject>.*`); `handler`
        gets that token too. Where each user may publish only below its own token (the per-tenant
        subjects), the token says who sent the message, whatever the message itself claims."""
        start = len(subject) + 1
        return await self._subscribe(
            f"{subject}.*",
            message_type,
            lambda message, reply_to, received: handler(message, reply_to, received[start:]),
            queue,
        )

    async def _subscribe(
        self,
        subject: str,
        message_type: Any,
        call: Callable[[Any, str | None, str], Awaitable[msgspec.Struct | None]],
        queue: str,
    ) -> Subscription:
        """`call` gets the message, the reply subject and the subject it came on."""

        endpoint = Endpoint(subject, queue, message_type)

        async def on_message(msg) -> None:
            started_ns = time.perf_counter_ns()
            reply_to = msg.reply or None
            try:
                message = decode(msg.data, message_type)
            except msgspec.DecodeError as exc:
                log.warning("undecodable_message", subject=subject, error=str(exc))
                await self._reply(
                    reply_to, Error("invalid_request", f"could not decode message: {exc}", param=field_at_fault(exc))
                )
                endpoint.record(started_ns, f"could not decode message: {exc}")
                return
            self._note_traffic(message)
            try:
                result = await call(message, reply_to, msg.subject)
            except Exception as exc:
                log.exception("handler_failed", subject=subject)
                await self._reply(reply_to, Error("internal", f"{type(exc).__name__}: {exc}", retriable=True))
                endpoint.record(started_ns, f"{type(exc).__name__}: {exc}")
                return
            if result is not None:
                await self._reply(reply_to, result)
            endpoint.record(started_ns, result.message if type(result) is Error else None)

        try:
            nats_subscription = await self._nc.subscribe(subject, queue=queue, cb=on_message)
        except nats.errors.Error as exc:
            raise BusUnavailable(f"cannot subscribe to {subject}: {exc}") from exc
        self._endpoints.append(endpoint)
        subscription = Subscription(nats_subscription, endpoint, self._endpoints)
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

    async def gather(
        self, subject: str, message: msgspec.Struct, reply_type: Any, expected: int, timeout_s: float
    ) -> list[Any] | Error:
        """Sends `message` to every listener of `subject` (not a queue group) and returns their
        replies, decoded (an undecodable one is logged and left out): at once when `expected` have
        come, else those that came within `timeout_s`. An `Error` if it could not be sent."""
        if expected <= 0:
            return []
        replies: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_reply(msg) -> None:
            replies.put_nowait(msg.data)

        try:
            data = self._encode_within_limit(subject, message)
            inbox = await self._nc.subscribe(self._nc.new_inbox(), cb=on_reply)
        except (nats.errors.Error, PayloadTooLarge) as exc:
            return Error("unavailable", f"cannot ask on {subject}: {exc}", retriable=True)
        answers = []
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            await self._nc.publish(subject, data, reply=inbox.subject)
            while len(answers) < expected:
                try:
                    data = await asyncio.wait_for(replies.get(), deadline - asyncio.get_running_loop().time())
                except TimeoutError:
                    break
                try:
                    answers.append(decode(data, reply_type | Error))
                except msgspec.DecodeError as exc:
                    log.warning("undecodable_reply", subject=subject, error=str(exc))
        except nats.errors.Error as exc:
            return Error("unavailable", f"cannot ask on {subject}: {exc}", retriable=True)
        finally:
            try:
                await inbox.unsubscribe()
            except nats.errors.Error:
                pass  # the connection is already gone, and the subscription with it
        return answers

    async def serve_as_service(self, name: str, version: str, description: str, metadata: dict[str, str]) -> None:
        """Answers NATS's service discovery (`$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`) as an instance
        of service `name`, its endpoints every subscription of this bus, as they are at each request,
        with their counts. Stops with the connection."""
        await start_service(self._nc, self._endpoints, name, version, description, metadata)

    async def reply(self, reply_to: str, message: msgspec.Struct) -> None:
        """Sends `message` to a requester; one too large for the bus becomes an `Error` that says so,
        so the requester fails at once instead of waiting out its timeout."""
        try:
            data = self._encode_within_limit(reply_to, message)
        except PayloadTooLarge as exc:
            data = encode(Error("invalid_request", f"the answer is too large to cross the server's bus: {exc}"))
        self._note_traffic(message)
        await self._nc.publish(reply_to, data)

    async def _reply(self, reply_to: str | None, message: msgspec.Struct) -> None:
        if reply_to:
            await self.reply(reply_to, message)

    async def flush(self, timeout_s: float = 2.0) -> None:
        await self._nc.flush(timeout=timeout_s)

    async def close(self) -> None:
        try:
            await self._nc.drain()
        except (TimeoutError, nats.errors.Error):
            await self._nc.close()
