"""A client that goes away mid-stream aborts its request, and its KV blocks come back."""

import threading
import time

import httpx


def stats(server) -> dict:
    return httpx.get(f"{server.base_url}/admin/stats", timeout=10).json()


def wait_until_idle(server, timeout_s: float = 10) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = stats(server)
        # Blocks the prefix cache keeps are free for the taking (evictable) once no request holds them.
        if (
            current["running"] == 0
            and current["waiting"] == 0
            and current["free_blocks"] + current["evictable_blocks"] == current["total_blocks"]
        ):
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


def stream_then_hang_up(server, body: dict, data_lines: int) -> None:
    """Reads `data_lines` SSE events of a streamed completion, then drops the connection."""
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen >= data_lines:
                return


def test_hanging_up_at_the_final_step_frees_everything(server):
    """The abort races the request's own finish: either way, nothing stays behind."""
    wait_until_idle(server)
    body = {"model": "demo", "prompt": "Count:", "max_tokens": 12, "stream": True, "ignore_eos": True}
    for data_lines in (11, 12, 13):  # before the last token, at it, after it (before [DONE])
        stream_then_hang_up(server, body, data_lines)
    wait_until_idle(server)


def test_hanging_up_everything_during_preemption_frees_everything(server):
    """More long streams than the KV pool holds: the scheduler preempts; then every client leaves."""
    idle = wait_until_idle(server)
    capacity = idle["total_blocks"] * 16  # tokens, at the default block size
    count = 8
    body = {
        "model": "demo",
        "prompt": "Go on and on:",
        "max_tokens": capacity // count * 2,
        "stream": True,
        "ignore_eos": True,
    }
    hang_up = threading.Event()

    def run():
        try:
            with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=120) as response:
                for _ in response.iter_lines():
                    if hang_up.is_set():
                        return
        except httpx.HTTPError:
            pass

    clients = [threading.Thread(target=run, daemon=True) for _ in range(count)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 120
    while stats(server)["preemptions"] == idle["preemptions"]:
        assert time.monotonic() < deadline, "no preemption happened"
        time.sleep(0.2)
    hang_up.set()
    for client in clients:
        client.join(30)
    wait_until_idle(server, timeout_s=20)
