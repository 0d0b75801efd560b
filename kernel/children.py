"""Child processes of the supervisor, and the limit on how often each may restart."""

import asyncio
import ctypes
import signal
import sys
import time
from collections import deque

import structlog

log = structlog.get_logger()
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: if the supervisor is killed outright, its children follow."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not glibc Linux: orphans then notice the bus going away instead


async def stop_process(process: asyncio.subprocess.Process | None, timeout_s: float) -> bool:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`; False if it had to be killed."""
    if process is None or process.returncode is not None:
        return True
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), timeout_s)
        return True
    except TimeoutError:
        process.kill()
        await process.wait()
        return False


class RestartBudget:
    """Allows at most `max_restarts` restarts within any `period_s` window."""

    def __init__(self, max_restarts: int, period_s: float) -> None:
        self.max_restarts = max_restarts
        self.period_s = period_s
        self._times: deque[float] = deque()

    def allow(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        while self._times and now - self._times[0] > self.period_s:
            self._times.popleft()
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True


class ChildProcess:
    """One actor process: `python -m actors.<actor> <flags>`; `name` tells replicas apart."""

    def __init__(self, name: str, actor: str, argv: list[str]) -> None:
        self.name = name
        self.actor = actor
        self.argv = argv
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"actors.{self.actor}",
            *self.argv,
            start_new_session=True,  # Ctrl-C reaches the supervisor only, which stops children in order
            preexec_fn=_die_with_parent,
        )
        log.info("child_started", child=self.name, pid=self.process.pid)

    async def wait(self) -> int:
        return await self.process.wait()

    async def stop(self, timeout_s: float) -> None:
        if not await stop_process(self.process, timeout_s):
            log.warning("child_killed", child=self.name, after_s=timeout_s)
