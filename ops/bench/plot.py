"""The benchmark's plot of its HTTP concurrency sweep: output throughput, and TTFT and inter-token
latency, against concurrency. Made from the JSON `ops.bench --json` writes, so a run on a machine
without matplotlib can be plotted elsewhere:

    python -m ops.bench.plot results.json --out plot.png

matplotlib (the `bench` extra) is imported only here, and only when a plot is made.
"""

import argparse
import json


def plot_sweep(results: dict, out: str) -> None:
    """Writes a PNG of `results["details"]["sweep"]` (and workload d's in-process throughput as a
    reference line, when the run measured it) to `out`."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    details = results["details"]
    sweep = details.get("sweep")
    if not sweep:
        raise ValueError("the results hold no concurrency sweep; run ops.bench with --mode http --concurrency ...")
    levels = [run["concurrency"] for run in sweep]
    fig, (throughput, latency) = plt.subplots(1, 2, figsize=(12, 4.5))

    throughput.plot(levels, [run["output_tok_s"] for run in sweep], marker="o", label="whole system over HTTP")
    offline = details.get("d")
    if offline:
        reference = offline["output_tokens"] / offline["seconds"]
        throughput.axhline(reference, linestyle="--", color="gray", label=f"in-process, workload d ({reference:,.0f})")
    throughput.set_ylabel("output tokens/s")
    throughput.set_ylim(bottom=0)

    for key, stat, style in (("ttft_ms", "p50", "o-"), ("ttft_ms", "p99", "o--"), ("itl_ms", "p50", "s-")):
        name = "TTFT" if key == "ttft_ms" else "ITL"
        latency.plot(levels, [run[key][stat] for run in sweep], style, label=f"{name} {stat}")
    latency.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 20, not 2 x 10^1
    latency.yaxis.set_major_formatter(plain)
    latency.yaxis.set_minor_formatter(plain)
    latency.set_ylabel("ms")

    for ax in (throughput, latency):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(level) for level in levels])
        ax.set_xlabel("concurrent streams")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    system = details.get("system", {})
    fig.suptitle(
        f"{system.get('model', '')} (random weights) on {system.get('device', '')}: "
        "throughput and latency against concurrency, over HTTP"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description="Plot the HTTP concurrency sweep of an ops.bench --json file.")
    parser.add_argument("results", help="the JSON file ops.bench --json wrote")
    parser.add_argument("--out", default="bench.png", help="the PNG to write")
    args = parser.parse_args()
    with open(args.results) as f:
        plot_sweep(json.load(f), args.out)
    print(args.out)


if __name__ == "__main__":
    main()
