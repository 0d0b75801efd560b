"""A burst of new clients is taken at once: the frontdoor's listen queue holds them while it is busy,
so no client's handshake is dropped to wait for TCP's retry, a second later."""

import os
import selectors
import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

BURST = 300  # new connections at once, more than aiohttp's default listen queue of 128
SOMAXCONN = int(Path("/proc/sys/net/core/somaxconn").read_text())  # the kernel's cap on any listen queue


def connected_within(address: tuple[str, int], count: int, timeout_s: float) -> int:
    """Opens `count` connections at once; returns how many the kernel completed within `timeout_s`."""
    selector = selectors.DefaultSelector()
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(address)
            sockets.append(sock)
            selector.register(sock, selectors.EVENT_WRITE)
        connected = 0
        deadline = time.monotonic() + timeout_s
        while connected < count and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                selector.unregister(key.fileobj)
                connected += key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        return connected
    finally:
        selector.close()
        for sock in sockets:
            sock.close()


@pytest.mark.skipif(SOMAXCONN < BURST, reason=f"net.core.somaxconn is {SOMAXCONN}: no listen queue holds {BURST}")
def test_a_burst_of_new_connections_waits_in_the_listen_queue_while_the_frontdoor_is_busy(server):
    url = urlsplit(server.base_url)
    frontdoor = server.child_pid("frontdoor")
    os.kill(frontdoor, signal.SIGSTOP)  # busy: it accepts nothing, and the kernel queues the handshakes
    try:
        connected = connected_within((url.hostname, url.port), BURST, timeout_s=0.5)
    finally:
        os.kill(frontdoor, signal.SIGCONT)
    assert connected == BURST
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
