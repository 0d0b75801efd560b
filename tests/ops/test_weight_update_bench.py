"""`python -m ops.bench.weight_update` on the CPU: a toy Llama served by the whole system, a gloo
trainer process; every record it writes, and docs/performance.md's section of them."""

import json
import subprocess
import sys
from pathlib import Path

from ops.performance_page import section

REPO = Path(__file__).parents[2]


def test_the_weight_update_benchmark_runs_on_the_cpu_and_loses_nothing(tmp_path):
    results = tmp_path / "weight-update.json"
    args = ["--model", "toy-llama", "--device", "cpu", "--streams", "6", "--stream-tokens", "160"]
    args += ["--prompt-tokens", "16", "--repeats", "2", "--bound-mb", "16", "--kv-blocks", "512"]
    args += ["--work-dir", str(tmp_path / "work"), "--json", str(results)]
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.weight_update", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    found = json.loads(results.read_text())
    updates = {u["transport"]: u for u in found["details"]["weight-update"]}
    assert set(updates) == {"disk", "gloo"}  # no CUDA IPC on a CPU
    for u in updates.values():
        assert u["arrived"] and u["tensors"] == 21 and len(u["pause_to_resume_s"]) == 2
        assert all(0 < s for s in u["load_s"]) and u["bound_s"] > 0
    streams = {s["mode"]: s for s in found["details"]["update-streams"]}
    assert set(streams) == {"abort", "retract", "in_place"}
    for s in streams.values():
        assert (s["lost"], s["repeated_or_missing"], s["version_errors"]) == (0, 0, 0), s
        assert s["switched"] == 6  # each stream ran through the update: tokens of both versions
    assert streams["abort"]["resumed_parts"] == 6 and streams["in_place"]["resumed_parts"] == 0
    page = section("weight-update-toy", found, None, tmp_path)
    assert "| gloo: " in page and "update paused in in_place mode" in page
