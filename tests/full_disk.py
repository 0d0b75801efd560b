"""A disk that fills: a real tmpfs of a few KiB (mounting needs root, or CAP_SYS_ADMIN; the tests
that use it skip where it cannot be mounted). Writes past its size fail with ENOSPC from the
kernel, as on a full disk."""

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """`mount_point` (made here) as a tmpfs of `size` ("32k") until the block ends."""
    mount_point.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)
