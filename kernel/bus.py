"""The bus as actors use it: typed publish, request, gather, subscribe and reply over nats-py.

Actors hand it msgspec Structs and get Structs back. Anything that goes wrong on the wire (a
message that does not decode, no responder, a timeout) comes back as a typed `Error`, never as
a nats exception, so callers handle one kind of failure; a subscription the server cannot confirm
raises `BusUnavailable`.

Its parts: kernel/bus_codec.py (msgpack in and out), kernel/bus_connection.py (the connection and
its reconnection), kernel/bus_subscriptions.py (decode, call the handler, answer) and
kernel/bus_service.py (the subscriptions as a NATS micro service), kernel/bus_kv.py and
kernel/bus_objects.py (JetStream's key-value and object buckets, over kernel/bus_jetstream.py).
Only these modules import nats.
"""

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec
import nats.errors
import structlog

from kernel.bus_auth import BusCredentials
from kernel.bus_codec import PayloadTooLarge, decode, encode, encode_within
from kernel.bus_connection import close_connection, open_connection
from kernel.bus_kv import KeyValueBucket, open_bucket
from kernel.bus_objects import ObjectBucket, open_object_bucket
from kernel.bus_service import start_service
from kernel.bus_subscriptions import Handler, Subscription, Subscriptions, TokenHandler
from kernel.busy_poll import BusyPoll
from schemas.errors import Error
from schemas.health import Heartbeat

log = structlog.get_logger()


class Bus:
    def __init__(self) -> None:
        self._nc = None  # nats-py's Client, once connected
        self._subscriptions: Subscriptions | None = None
        self._reconnect_listeners: list[Callable[[], Awaitable[None]]] = []
        self._busy_poll: BusyPoll | None = None

    @classmethod
    async def connect(cls, url: str, name: str, credentials: BusCredentials | None = None) -> "Bus":
        """Connects (as the user of `credentials`, if given), and keeps reconnecting forever if
        the server goes away."""
        bus = cls()
        bus._nc = await open_connection(url, name, credentials, bus._resynchronise)
        bus._subscriptions = Subscriptions(bus._nc, bus.reply, bus._note_traffic)
        return bus

    def on_reconnect(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Calls `listener` after each reconnection. Core NATS delivers at most once, so messages
        published while the connection was down may be lost in either direction: a listener
        resynchronises whatever state depends on them. It must return quickly (spawn long work)."""
        self._reconnect_listeners.append(listener)

    async def _resynchronise(self) -> None:
        for listener in self._reconnect_listeners:
            await listener()

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
        limit = self._nc.max_payload if limit_bytes is None else min(limit_bytes, self._nc.max_payload)
        return encode_within(subject, message, limit)

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
        return await self._subscriptions.add(
            subject, message_type, lambda message, reply_to, _subject: handler(message, reply_to), queue
        )

    async def subscribe_under(
        self, subject: str, message_type: Any, handler: TokenHandler, queue: str = ""
    ) -> Subscription:
        """As `subscribe`, to every subject one token below `subject` (`<subject>.*`); `handler`
        gets that token too. Where each user may publish only below its own token (the per-tenant
        subjects), the token says who sent the message, whatever the message itself claims."""
        start = len(subject) + 1
        return await self._subscriptions.add(
            f"{subject}.*",
            message_type,
            lambda message, reply_to, received: handler(message, reply_to, received[start:]),
            queue,
        )

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
        await start_service(self._nc, self._subscriptions.endpoints, name, version, description, metadata)

    async def reply(self, reply_to: str, message: msgspec.Struct) -> None:
        """Sends `message` to a requester; one too large for the bus becomes an `Error` that says so,
        so the requester fails at once instead of waiting out its timeout."""
        try:
            data = self._encode_within_limit(reply_to, message)
        except PayloadTooLarge as exc:
            data = encode(Error("invalid_request", f"the answer is too large to cross the server's bus: {exc}"))
        self._note_traffic(message)
        await self._nc.publish(reply_to, data)

    async def key_value(self, name: str) -> KeyValueBucket:
        """The server's JetStream key-value bucket `name`, made if new (kernel/bus_kv.py); raises
        `JetStreamUnavailable` where the server has no JetStream."""
        return await open_bucket(self._nc, name)

    async def object_bucket(self, name: str, max_bytes: int) -> ObjectBucket:
        """The server's JetStream object bucket `name` of at most `max_bytes`, made if new
        (kernel/bus_objects.py); raises `JetStreamUnavailable` where the server has no JetStream."""
        return await open_object_bucket(self._nc, name, max_bytes)

    async def flush(self, timeout_s: float = 2.0) -> None:
        await self._nc.flush(timeout=timeout_s)

    async def close(self) -> None:
        await close_connection(self._nc)
