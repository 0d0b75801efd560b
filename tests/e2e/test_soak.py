"""Longer soaks, outside the default suite: `python -m pytest -m slow tests/e2e/test_soak.py`."""

import asyncio
import json
import threading
import time

import httpx
import pytest

from ops.local_server import start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory):
    running = start_server(
        tmp_path_factory.mktemp("soak"), "--num-kv-blocks", "1024", "--max-concurrent-requests", "4096"
    )
    yield running
    running.stop()


async def stream(
    http: httpx.AsyncClient, base_url: str, i: int, max_tokens: int, hang_up_after: int | None
) -> int | None:
    """Streams one completion; returns its completion token count, or None when it hung up
    after `hang_up_after` chunks."""
    body = {
        "model": "demo",
        "prompt": f"Soak {i}",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.7,
        "seed": i,
        "stream_options": {"include_usage": True},
    }
    chunks, completion_tokens = 0, None
    async with http.stream("POST", f"{base_url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks += 1
                completion_tokens = (json.loads(line[6:]).get("usage") or {}).get(
                    "completion_tokens", completion_tokens
                )
                if hang_up_after is not None and chunks >= hang_up_after:
                    return None
    return completion_tokens


def stats(server) -> dict:
    return httpx.get(f"{server.base_url}/admin/stats", timeout=10).json()


def assert_back_to_idle(server, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        current = stats(server)
        if (
            current["running"] == current["waiting"] == 0
            and current["free_blocks"] + current["evictable_blocks"] == current["total_blocks"]
        ):
            return current
        assert time.monotonic() < deadline, f"not idle: {current}"
        time.sleep(0.2)


async def test_disconnect_soak_leaks_nothing(soak_server):
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        results = await asyncio.gather(
            *(stream(http, soak_server.base_url, i, 32, hang_up_after=3 if i % 2 else None) for i in range(400))
        )
    assert all(r == 32 for r in results[0::2])
    assert_back_to_idle(soak_server)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


class MemoryWatch:
    """The resident memory of every process of the deployment: now, and the peak while watching."""

    def __init__(self, server) -> None:
        pids = server.process_pids()
        self.pids = {
            name: pids[name] for name in ("executor", "scheduler", "tokenizer", "gateway", "frontdoor", "nats-server")
        }
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> dict[str, float]:
        return {name: rss_mb(pid) for name, pid in self.pids.items()}

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = {name: max(mb, self.peak[name]) for name, mb in self.now().items()}

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


async def thousand_streams(server) -> list:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        return await asyncio.gather(*(stream(http, server.base_url, i, 8, None) for i in range(1000)))


async def test_a_thousand_concurrent_streams_complete_in_bounded_memory(soak_server):
    """Twice: every stream completes, and the second thousand leaves memory where the first did."""
    before = MemoryWatch(soak_server).now()
    after = []
    for _ in range(2):
        with MemoryWatch(soak_server) as watch:
            assert await thousand_streams(soak_server) == [8] * 1000
            assert_back_to_idle(soak_server)
        after.append(watch.now())
        print(json.dumps({"before_mb": before, "peak_mb": watch.peak, "after_mb": after[-1]}))
    for name in before:
        assert after[1][name] <= after[0][name] * 1.1 + 20, f"{name} grew from {after[0][name]} to {after[1][name]} MB"
