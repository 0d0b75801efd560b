"""`python -m ops.bench.grammar_host`: the host side of json_schema's feature cost runs on the CPU,
and every token its runner draws from a filled mask is one the grammar takes."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


@pytest.mark.slow  # about 6 s: a 128,256-token vocabulary and a thousand steps
def test_the_grammar_host_benchmark_runs():
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.grammar_host", "--requests", "2", "--fill-threads", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "requests ended: {'length': 2}" in done.stdout
    assert "all (" in done.stdout and "mask work, wall: p50" in done.stdout
