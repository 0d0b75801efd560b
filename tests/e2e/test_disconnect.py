"""A client that goes away mid-stream aborts its request, and its KV blocks come back."""

import time

import httpx


def stats(server) -> dict:
    return httpx.get(f"{server.base_url}/admin/stats", timeout=10).json()


def wait_until_idle(server, timeout_s: float = 10) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = stats(server)
        # Blocks the prefix cache keeps are free for the taking (evictable) once no request holds them.
        if current["running"] == 0 and current["waiting"] == 0 and \
                current["free_blocks"] + current["evictable_blocks"] == current["total_blocks"]:
            return current
        time.sleep(0.1)
    raise AssertionError(f"not idle after {timeout_s} s: {current}")


def test_disconnect_mid_stream_frees_the_blocks(server):
    wait_until_idle(server)
    body = {"model": "demo", "prompt": "A long story:", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert all(line.startswith("data: ") or not line for line in received)
        busy = stats(server)
        assert busy["running"] == 1 and busy["free_blocks"] < busy["total_blocks"]
    idle = wait_until_idle(server)
    assert server.find("request_aborted")
    flushed = httpx.post(f"{server.base_url}/admin/flush_cache", timeout=10).json()
    assert flushed["freed_blocks"] == idle["evictable_blocks"]
    assert stats(server)["free_blocks"] == idle["total_blocks"]
