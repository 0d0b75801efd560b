"""How busy each process of a deployment was over a span of wall time, read from /proc: a benchmark
over HTTP is only a measure of the server while no process on the path (the clients included) is
saturated, so the bench prints each one's CPU time as a share of one core."""

import os
import time
from pathlib import Path

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid` (all its threads) so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name, field 2, is in parentheses and may hold spaces: count fields after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    user_ticks, system_ticks = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (user_ticks + system_ticks) / CLOCK_TICKS_PER_S


class CpuMeter:
    """Measures named processes from `start()` to `shares()`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.started_at = 0.0
        self.started_cpu: dict[str, float] = {}

    def start(self) -> None:
        self.started_at = time.perf_counter()
        self.started_cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def shares(self) -> dict[str, float]:
        """CPU seconds each process spent since `start()`, per second of wall time (1.0: one core
        busy all along; a process's threads together can pass 1.0)."""
        wall_s = time.perf_counter() - self.started_at
        return {name: (cpu_seconds(pid) - self.started_cpu[name]) / wall_s for name, pid in self.pids.items()}
