"""A real trainer process for the weight-group tests: ops/rl/weight_push.py's command line, run as
a subprocess that the tests read from, and kill."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from kernel.nats_server import free_port

REPO = Path(__file__).resolve().parents[2]


class Trainer:
    """`python -m ops.rl.weight_push` pushing `checkpoint` to a group at a fresh port."""

    def __init__(self, checkpoint: Path, *options: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "ops.rl.weight_push", "--master-port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, "--checkpoint", str(checkpoint), *options],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | (env or {}),
        )

    def request(self) -> dict:
        """The update request it prints once the group is joined."""
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the trainer exited with {self.process.wait()} before joining")
        return json.loads(line)

    def said(self) -> str:
        return self.process.stdout.readline().strip()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def hang(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def close(self) -> None:
        """Lets it exit (it waits for its stdin to close, keeping the group's store alive till then)."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
