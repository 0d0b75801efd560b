"""The benchmark's report: rows printed as they are measured (so a run cut short still reports),
then one table under the run's conditions, and the details as JSON for `ops.bench_plot`.
"""

import json
from dataclasses import asdict, dataclass, field


@dataclass
class Row:
    workload: str
    measured: str
    bound: str
    ratio: str
    target: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)  # device, model, settings: printed above the table
    details: dict = field(default_factory=dict)  # per workload, for the JSON file

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(" | ".join(cell for cell in (row.workload, row.measured, row.bound, row.ratio, row.target) if cell),
              flush=True)

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
        return {"conditions": self.conditions, "rows": [asdict(r) for r in self.rows], "details": self.details}

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.as_json(), f, indent=2)


def p50_p90_p99(figures: dict[str, float]) -> str:
    """A cell of one `percentiles_ms` dict: "p50 / p90 / p99 ms"."""
    return f"{figures['p50']:.2f} / {figures['p90']:.2f} / {figures['p99']:.2f} ms"
