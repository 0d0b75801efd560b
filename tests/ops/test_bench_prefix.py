"""The prefix sharing benchmark runs end to end on a tiny model on CPU and reports what it says."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_prefix_bench_reports_sharing_on_and_off(build_tiny_model, tmp_path):
    out = tmp_path / "prefix.json"
    args = [
        "--model-dir",
        str(build_tiny_model("llama")),
        "--device",
        "cpu",
        "--kv-blocks",
        "1024",
        "--sessions",
        "3",
        "--turns",
        "3",
        "--system-tokens",
        "64",
        "--user-tokens",
        "8",
        "--answer-tokens",
        "8",
        "--n",
        "3",
        "--n-prompts",
        "2",
        "--n-prompt-tokens",
        "40",
        "--json",
        str(out),
    ]
    run = subprocess.run(
        [sys.executable, "-m", "ops.bench.prefix", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())["results"]
    multi_turn, no_sharing, n_sampling = results.values()
    assert multi_turn["on"]["hit_rate"] > 0.5  # the system prompt and earlier turns come from the cache
    assert multi_turn["off"]["hit_rate"] == no_sharing["on"]["hit_rate"] == 0
    assert n_sampling["on"]["hit_rate"] > 0.5  # the forks share their prompt
    for workload in results.values():
        assert workload["on"]["output_tokens"] == workload["off"]["output_tokens"] > 0
        assert workload["ratio"] > 0
    assert "| multi-turn" in run.stdout
