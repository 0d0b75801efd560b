"""`python -m ops.bench.kv_tier_copy` on the CPU with a toy shape: its rows, its figures in the JSON,
docs/performance.md's section of them, and no shared-memory segment left behind."""

import json
import subprocess
import sys
from pathlib import Path

from actors.cache_tier.host_segment import SHM_DIR
from ops.performance_page import section

REPO = Path(__file__).parents[2]


def test_the_kv_tier_copy_benchmark_runs_on_the_cpu(tmp_path):
    results = tmp_path / "kv-tier-copy.json"
    args = ["--model", "toy-llama", "--device", "cpu", "--pool-blocks", "64", "--host-slots", "32"]
    args += ["--blocks", "16", "--transfers", "3", "--json", str(results)]
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.kv_tier_copy", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    found = json.loads(results.read_text())
    workloads = [row["workload"] for row in found["rows"]]
    assert workloads == [
        "GPU to host (save): 16 scattered blocks of 0.01 MiB",
        "host to GPU (load): 16 scattered blocks of 0.01 MiB",
        "blocks loaded back equal those saved",
    ]
    assert [row["target"] for row in found["rows"]] == [">= 45 GB/s", ">= 45 GB/s", "same"]
    figures = found["details"]["kv-tier-copy"]
    assert figures["same_blocks"] and figures["block_bytes"] == 2 * 2 * 16 * 2 * 32 * 2  # toy-llama, bf16
    assert len(figures["saves_gb_s"]) == len(figures["loads_gb_s"]) == 3
    assert all(f > 0 for f in (figures["save_gb_s"], figures["load_gb_s"], figures["ceiling_load_gb_s"]))
    assert not [p for p in SHM_DIR.iterdir() if p.name.startswith(("kv-tier-copy-", ".kv-tier-copy-"))]
    page = section("kv-tier-copy-toy", found, None, tmp_path)
    assert "| host to GPU (load): 16 scattered blocks of 0.01 MiB |" in page
