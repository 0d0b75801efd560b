"""`python -m ops.bench.logprob_accuracy` on the CPU: in float32 our logprobs are transformers' (the
bf16 run on a GPU also compares with transformers in float32)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def test_logprob_accuracy_reports_every_kind_against_both_references(tmp_path):
    results = tmp_path / "accuracy.json"
    args = ["--model", "toy-llama", "--device", "cpu", "--dtype", "float32", "--prompts", "2"]
    args += ["--prompt-tokens", "12", "--new-tokens", "4", "--json", str(results)]
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.logprob_accuracy", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    errors = json.loads(results.read_text())["details"]["logprob-error"]
    assert [(e["reference"], e["kind"]) for e in errors] == [
        ("transformers float32", kind) for kind in ("sampled", "prompt", "top")
    ]
    counts = {e["kind"]: e["count"] for e in errors}
    assert counts == {"sampled": 8, "prompt": 22, "top": 40}
    assert all(0 <= e["mean_abs"] <= e["max_abs"] < 1e-4 for e in errors)
