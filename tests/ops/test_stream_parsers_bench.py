"""`python -m ops.bench.stream_parsers`: its rows, its JSON, and docs/performance.md's section of it."""

import json
import subprocess
import sys
from pathlib import Path

from ops.performance_page import section

REPO = Path(__file__).parents[2]


def test_the_stream_parsers_benchmark_runs(tmp_path):
    results = tmp_path / "stream-parsers-cpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.stream_parsers", "--repeats", "2", "--json", str(results)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    found = json.loads(results.read_text())
    assert [row["workload"] for row in found["rows"]] == [
        "plain answer: chunk and SSE event per delta",
        "thinking, answer and a 1 KB tool call: chunk and SSE event per delta",
    ]
    assert all(row["measured"].endswith("µs)") and row["ratio"].endswith("x") for row in found["rows"])
    assert found["details"]["run"]["device"].startswith("CPU")
    assert "## stream-parsers-cpu: chat-reply parsers on CPU" in section("stream-parsers-cpu", found, None, tmp_path)
