"""A subscription is on the server when `Bus.subscribe` returns, so a message that another client
publishes right after reaches the handler: nothing is dropped for having overtaken the subscription."""

import asyncio
import socket
import time

import msgspec

from kernel.bus import Bus
from kernel.nats_server import EmbeddedNats
from schemas.errors import Error

# nats-py 2.16 lets a flush's PING overtake the SUB still in its buffer (Bus.subscribe works around
# it); without that, about one subscribe in ten on a 2-core machine: enough of them to see it.
SUBSCRIPTIONS = 200


def raw_client(port: int) -> socket.socket:
    """A NATS client on a plain blocking socket: its publishes leave at once, whatever our loop does."""
    raw = socket.create_connection(("127.0.0.1", port))
    raw.recv(4096)  # the server's INFO line
    raw.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
    while b"PONG" not in raw.recv(4096):
        pass
    return raw


async def test_a_message_published_right_after_subscribe_returns_is_delivered(tmp_path):
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    bus = await Bus.connect(server.url, "subscriber")
    raw = raw_client(server.port)
    payload = msgspec.msgpack.encode(Error("test", "hello"))
    try:
        for i in range(SUBSCRIPTIONS):
            received = asyncio.Event()

            async def handler(message: Error, _reply_to) -> None:
                assert message.message == "hello"
                received.set()

            await bus.subscribe(f"test.subscribe.{i}", Error, handler)
            raw.sendall(b"PUB test.subscribe.%d %d\r\n%s\r\n" % (i, len(payload), payload))
            time.sleep(0.005)  # holds our loop: a subscription still in the client's buffer would stay there
            await asyncio.wait_for(received.wait(), 5)
    finally:
        raw.close()
        await bus.close()
        await server.stop()


async def test_a_subscription_under_a_subject_hands_the_handler_the_token_it_came_on(tmp_path):
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    bus = await Bus.connect(server.url, "subscriber")
    received: list[tuple[str, str]] = []
    done = asyncio.Event()

    async def handler(message: Error, _reply_to, token: str) -> None:
        received.append((token, message.message))
        if message.message == "last":
            done.set()

    try:
        await bus.subscribe_under("test.generate", Error, handler)
        for subject, text in [
            ("test.generate", "bare"),
            ("test.generate.alpha", "from alpha"),
            ("test.generate.a.b", "too deep"),
            ("test.generate.beta", "last"),
        ]:
            await bus.publish(subject, Error("test", text))
        await asyncio.wait_for(done.wait(), 5)
        assert received == [("alpha", "from alpha"), ("beta", "last")]
    finally:
        await bus.close()
        await server.stop()
