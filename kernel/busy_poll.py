"""Keeps an actor's event loop polling for a while after request traffic, instead of sleeping.

A process that sleeps in epoll between bus messages pays for waking up on the next one, of the
order of a tenth of a millisecond a hop, which a process that polls instead spares (measurements:
docs/journal/benchmarks.md, section "The prompt step's attention calls; the actors poll the bus").
A request crosses four such hops before its first token reaches its client (origin to
scheduler, scheduler to executor, executor to tokenizer, tokenizer to origin; six with a text
prompt, which a tokenizer encodes first), so the actors on that path poll for a while after each
message they send or receive, as an engine's scheduler that spins between steps does. Each costs
a core while requests flow and nothing once they stop; heartbeats, which every actor sends each
second, do not count as traffic, nor does a request nobody answers (a scheduler asks for its
executor every 0.2 s until one does). `window_s_for` decides the window: polling processes need
cores of their own, or they slow each other and a model computed on the CPU down.
"""

import asyncio
import glob
import os
import time

# Polling on a machine with fewer cores than this would take them from the work itself.
MIN_CORES_TO_POLL = 8
DEFAULT_WINDOW_MS = 50.0


def window_s_for(busy_poll_ms: float | None, device: str) -> float:
    """The polling window in seconds: `busy_poll_ms` if given, else DEFAULT_WINDOW_MS where the
    model runs on a GPU (`device` cuda, or auto on a machine with an NVIDIA device) and the process
    has at least MIN_CORES_TO_POLL cores, else none: a model computed on the CPU needs its cores
    for the computation."""
    if busy_poll_ms is None:
        on_gpu = device.startswith("cuda") or (device == "auto" and gpu_visible())
        busy_poll_ms = DEFAULT_WINDOW_MS if on_gpu and usable_cores() >= MIN_CORES_TO_POLL else 0.0
    return busy_poll_ms / 1000


def gpu_visible() -> bool:
    """Whether an NVIDIA device is there for `auto` to pick, without importing torch (CUDA_VISIBLE_DEVICES
    empty or -1 hides them all)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES") not in ("", "-1") and bool(glob.glob("/dev/nvidia[0-9]*"))


def usable_cores(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> float:
    """The cores this process may run on, or its cgroup's CPU quota where that is fewer (a
    container given `--cpus 4` on a 64-core host sees all 64 in its affinity)."""
    cores = float(len(os.sched_getaffinity(0)))
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()
    except (OSError, ValueError):
        return cores
    return cores if quota == "max" else min(cores, int(quota) / int(period))


class BusyPoll:
    """`note_traffic` on each message of a request; `run` as a task keeps the loop busy until
    `window_s` has passed without one, then sleeps until the next."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.last_traffic = 0.0  # time.monotonic()
        self.polling = False
        self._traffic = asyncio.Event()

    def note_traffic(self) -> None:
        self.last_traffic = time.monotonic()
        self._traffic.set()

    async def run(self) -> None:
        while True:
            await self._traffic.wait()
            self._traffic.clear()
            self.polling = True
            # A ready task makes the loop poll its sockets without blocking, so a message that
            # arrives meanwhile is read on the next turn, not after a wake-up.
            while time.monotonic() - self.last_traffic < self.window_s:
                await asyncio.sleep(0)
            self.polling = False
