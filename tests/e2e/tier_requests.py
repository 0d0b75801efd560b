"""What the tier tests (test_host_tier.py, test_disk_tier.py) send and read: long prompts that fill
many KV blocks, greedy completions of them, the cache's figures, and the host segments a server
leaves in /dev/shm (they outlive its processes, until the supervisor stops)."""

import time
from pathlib import Path

import httpx

from actors.cache_tier.host_segment import SHM_DIR, segment_prefix


def prompt(topic: str) -> str:
    return f"A long shared preamble about the {topic}, repeated so that it fills many KV blocks. " * 5


def complete(server, text: str) -> dict:
    body = {"model": "demo", "prompt": text, "max_tokens": 6, "temperature": 0}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def cache_report(server) -> dict:
    response = httpx.get(f"{server.base_url}/admin/cache", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def settle(server) -> dict:
    """Waits until no block is on its way into a tier (the host's copies and the disk's writes run in
    the background); returns the cache's figures then."""
    for _ in range(100):
        report = cache_report(server)
        if not any(tier["pending_blocks"] for tier in report["tiers"].values()):
            return report
        time.sleep(0.1)
    return report


def host_segments(data_dir: Path) -> list[Path]:
    return list(SHM_DIR.glob(f"{segment_prefix(str(data_dir))}*"))
