"""The benchmark's report: rows printed as they are measured (so a run cut short still reports),
then one table under the run's conditions, and the details (records.py) as JSON for
`ops.bench.plot` and ops/performance_page.py.
"""

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import msgspec

from ops.bench.records import Details, Percentiles, Row, RunIdentity

SOFTWARE = ("torch", "triton", "flashinfer-python", "transformers", "nats-py", "msgspec")


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)  # device, model, settings: printed above the table
    details: Details = field(default_factory=Details)  # per workload, for the JSON file

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(
            " | ".join(cell for cell in (row.workload, row.measured, row.bound, row.ratio, row.target) if cell),
            flush=True,
        )

    def note(self, condition: str) -> None:
        """A line of the run's conditions, printed now and again above the table."""
        self.conditions.append(condition)
        print(condition, flush=True)

    def print_table(self) -> None:
        header = ("workload", "measured", "bound / ceiling / detail", "ratio", "target")
        rows = [header] + [(r.workload, r.measured, r.bound, r.ratio, r.target) for r in self.rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        print()
        for line in self.conditions:
            print(line)
        for i, row in enumerate(rows):
            print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |")
            if i == 0:
                print("|" + "|".join("-" * (w + 2) for w in widths) + "|")

    def as_json(self) -> dict:
        return msgspec.to_builtins({"conditions": self.conditions, "rows": self.rows, "details": self.details})

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.as_json(), f, indent=2)


def run_identity(model: str, device: str, module: str = "ops.bench") -> RunIdentity:
    """What a results page needs to say where a figure came from: the command that made it, the
    commit it ran on, when, on what device and with which software."""
    return RunIdentity(
        command=shlex.join(["python", "-m", module, *sys.argv[1:]]),
        commit=_commit(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        model=model,
        device=device,
        software={"python": platform.python_version()} | {name: _version(name) for name in SOFTWARE},
    )


def _commit() -> str:
    """HEAD's hash, marked when the tree differs from it: such figures are of no commit. A tree
    copied to another machine without its history names its commit in BENCH_COMMIT."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    repo = Path(__file__).parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes" if dirty else "")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def p50_p90_p99(figures: Percentiles) -> str:
    """A cell of one figure's percentiles: "p50 / p90 / p99 ms"."""
    return f"{figures.p50:.2f} / {figures.p90:.2f} / {figures.p99:.2f} ms"
