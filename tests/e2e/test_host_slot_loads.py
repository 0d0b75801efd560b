"""A host slot that a sent load still has to read is never handed to the disk tier, through the whole
stack: the executor is held inside a step (step_faults/sitecustomize.py's `pause`) while a request
whose prefix the host holds is admitted, its LoadBlocks waiting on the executor; then another
request's fetch from disk needs every slot, evicting that prefix's (or a host flush frees them
first), and the cache_tier writes what it fetched into the slots it was given. Once the step ends,
the first request's load reads its slots: it must draw the tokens it drew when computed from
scratch, not continue another prompt's KV. The fetch gets only the slots no load reads (a shorter
hit), and every slot is free again once the executor reports the load made."""

import threading
import time
from pathlib import Path

import httpx
import pytest

from actors.cache_tier.host_segment import remove_segments  # what a server that did not stop cleanly left
from ops.local_server import start_server
from tests.e2e.tier_requests import cache_report, complete, prompt, settle

HOST_SLOTS = 16  # a prompt below fills 13: a fetch of another needs most of that prompt's slots
FLAGS = ("--num-kv-blocks", "64", "--host-kv-blocks", str(HOST_SLOTS), "--disk-kv-gb", "1")


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("step_faults")


@pytest.fixture(scope="module")
def server(tmp_path_factory, faults):
    data_dir = tmp_path_factory.mktemp("host-slot-loads")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STEP_FAULTS_DIR", str(faults))
        env.setenv("PYTHONPATH", str(Path(__file__).parent / "step_faults"))
        running = start_server(data_dir, *FLAGS)
    yield running
    running.stop()
    remove_segments(data_dir)


def flush(server, tier: str) -> None:
    response = httpx.post(f"{server.base_url}/admin/flush_cache", json={"tier": tier}, timeout=70)
    assert response.status_code == 200, response.text


def cached_tokens(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def hits(server, tier: str) -> int:
    return cache_report(server)["tiers"][tier]["hits"]


def wait_until(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.02)


class InBackground(threading.Thread):
    """A completion sent from a thread: its reply once joined."""

    def __init__(self, server, text: str) -> None:
        super().__init__(daemon=True)
        self.server, self.text, self.reply = server, text, None
        self.start()

    def run(self) -> None:
        self.reply = complete(self.server, self.text)

    def text_drawn(self) -> str:
        self.join(120)
        return self.reply["choices"][0]["text"]


@pytest.mark.parametrize("host_flush", [False, True], ids=["evicted-by-a-fetch", "freed-by-a-host-flush"])
def test_a_slot_a_sent_load_reads_is_not_refilled_before_the_load(server, faults, host_flush):
    loaded, fetched = (
        f"{kind} of the {'flushed' if host_flush else 'evicted'} slots" for kind in ("keepers", "fetchers")
    )
    flush(server, "gpu")
    flush(server, "host")
    fetched_first = complete(server, prompt(fetched))["choices"][0]["text"]
    settle(server)  # on disk too
    flush(server, "gpu")
    flush(server, "host")  # now on disk only
    loaded_first = complete(server, prompt(loaded))["choices"][0]["text"]
    settle(server)
    flush(server, "gpu")  # now on the host (and the disk) only

    pause = faults / "pause"
    pause.touch()
    try:
        holder = InBackground(server, "Hello")  # its first step holds the executor
        wait_until((faults / "paused").exists, "step held")
        host_hits = hits(server, "host")
        on_host = InBackground(server, prompt(loaded))
        wait_until(lambda: hits(server, "host") > host_hits, "admission from the host")  # its LoadBlocks is sent
        if host_flush:
            flush(server, "host")
        disk_hits = hits(server, "disk")
        on_disk = InBackground(server, prompt(fetched))
        wait_until(lambda: hits(server, "disk") > disk_hits, "fetch from disk")  # the cache_tier wrote its slots
    finally:
        pause.unlink()
    holder.join(120)
    assert on_host.text_drawn() == loaded_first
    assert on_disk.text_drawn() == fetched_first
    assert cached_tokens(on_disk.reply) < 4 * 16  # its fetch got the slots no load read: a shorter hit

    flush(server, "gpu")
    flush(server, "host")  # every slot free, now that the executor reported the loads made
    again = complete(server, prompt(fetched))
    assert cached_tokens(again) >= again["usage"]["prompt_tokens"] - 16  # all of it fetched again
    assert again["choices"][0]["text"] == fetched_first
