"""Starts a real local deployment (the supervisor, an embedded nats-server, every actor a process)
and follows its JSON logs: for end-to-end tests and fault drills."""

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats

from kernel import bus_auth
from kernel.model_source import DEMO_MODEL
from kernel.nats_server import free_port
from ops.bus_client import connect

STARTUP_TIMEOUT_S = 180


@dataclass
class RunningServer:
    process: subprocess.Popen
    data_dir: Path
    port: int
    events: list[dict] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def nats_url(self) -> str:
        return self.wait_for("serving")["nats_url"]

    @property
    def client_credentials(self) -> bus_auth.BusCredentials:
        """The `client` user's, which other services get: the public subjects and their replies."""
        return bus_auth.load_credentials(bus_auth.credentials_path(self.data_dir, "client"))

    async def connect_nats(self, user: str = "client", **options) -> nats.NATS:
        """A plain nats-py connection as `user` (`bus_grants.tenant_user(name)` for a tenant), as ops/bus_client.py connects."""
        return await connect(self.nats_url, bus_auth.credentials_path(self.data_dir, user), **options)

    @property
    def model_dir(self) -> Path:
        return Path(self.wait_for("serving")["model_dir"])

    def _read_logs(self) -> None:
        for line in self.process.stderr:
            events = json_objects(line)
            if events is None:
                sys.stderr.write(line)
                continue
            with self._lock:
                self.events += events

    def find(self, event: str, **match) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e.get("event") == event and all(e.get(k) == v for k, v in match.items())]

    def wait_for(self, event: str, timeout_s: float = STARTUP_TIMEOUT_S, count: int = 1, **match) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.find(event, **match)
            if len(found) >= count:
                return found[count - 1]
            if self.process.poll() is not None:
                raise RuntimeError(f"supervisor exited with {self.process.returncode} before {event!r}")
            time.sleep(0.05)
        raise TimeoutError(f"no {event!r} event {match} within {timeout_s} s")

    def child_pid(self, actor: str) -> int:
        return self.process_pids()[actor]

    def process_pids(self) -> dict[str, int]:
        """The pid of every process the supervisor runs now, by name: each actor and nats-server."""
        pids = {event["child"]: event["pid"] for event in self.find("child_started")}  # the latest start wins
        return {**pids, "nats-server": self.find("nats_started")[-1]["pid"]}

    def stop(self, timeout_s: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)


def json_objects(line: str) -> list[dict] | None:
    """The JSON log events on one line: the actors share the supervisor's stderr, so two events
    written at once can land on one line. None if the line is not JSON (a traceback, say)."""
    decoder, events, position = json.JSONDecoder(), [], 0
    line = line.strip()
    while position < len(line):
        try:
            event, position = decoder.raw_decode(line, position)
        except json.JSONDecodeError:
            return None
        if not isinstance(event, dict):
            return None
        events.append(event)
    return events or None


def start_server(data_dir: Path, *flags: str, model: str | None = DEMO_MODEL) -> RunningServer:
    """The supervisor serving `model` (None: the default chat model) with `flags`; returns once it serves."""
    if model == DEMO_MODEL:
        place_demo_model(data_dir)
    port = free_port()
    model_flags = ["--model", model] if model else []
    command = [
        sys.executable,
        "-m",
        "kernel.supervisor",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        *model_flags,
        *flags,
    ]
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[1],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    server = RunningServer(process, data_dir, port)
    threading.Thread(target=server._read_logs, daemon=True).start()
    try:
        server.wait_for("serving")
    except Exception:
        server.stop()
        raise
    return server


def place_demo_model(data_dir: Path) -> None:
    """Copies the demo model, built once per process, to where the supervisor builds its own: it
    finds it whole and builds none. A build spends seconds importing torch, at every one of the
    many starts of a test run; the copy is what it would write, byte for byte (seeded weights)."""
    target = data_dir / "models" / DEMO_MODEL
    if not target.exists():
        shutil.copytree(_built_demo_model(), target)


@functools.cache
def _built_demo_model() -> Path:
    cache = Path(tempfile.mkdtemp(prefix="demo-model-"))
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    built = subprocess.run(
        [sys.executable, "-m", "gpu.model_builder", "--out", str(cache / DEMO_MODEL)],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    return Path(built.stdout.strip())
