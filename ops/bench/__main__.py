"""Benchmarks of the GPU path on a random-weight model of a real shape, judged against ceilings
measured in the same run; prints one table. The workloads run on the in-process engine (the
scheduler's batcher and the executor's batch, no bus); `--mode http` also runs d and e through the
whole system (supervisor, bus, every actor a process) over HTTP, and a concurrency sweep.

    python -m ops.bench --model llama-3.1-8b [--workloads a,b,c,d] [--hf-requests 0]
    python -m ops.bench --model llama-3.1-8b --mode http --workloads d,e --hf-requests 0 \\
        --concurrency 1,4,16,64,256 --json out.json [--plot out.png]

a: batch-1 decode at 1K context: inter-token latency vs (weights read + KV bytes) / copy bandwidth,
   where the weights read exclude the (untied) embedding table, of which a step gathers one row
b: batch-256 decode at 1K context: step time vs the same bound
c: prefill of 2K-token prompts: achieved TFLOP/s vs a bf16 matrix product's
d: offline throughput, prompt and output lengths uniform in --lengths [100, 1024], ignore_eos;
   and transformers' batched generate on the same requests (the first --hf-requests of them), as
   many at a time as its KV cache fits in memory
e: low load: single requests one at a time (--low-load-*: 40 of 500 prompt + 16 output tokens);
   TTFT is from the submit to the end of the step that drew the first token
Every request draws greedily unless --temperature (and --top-p, --top-k, --min-p) say otherwise.
--feature-cost logprobs,rules,json_schema: a and d again with every request asking for the feature,
   each beside the run without it (ops/bench/feature_cost.py).
--deterministic: a and d again on a runner with --deterministic's batch-invariant kernels (the same
   weights), each beside the default run (target: within 1.15x); later workloads run on it.
--mode http (runs d and e in-process first, whatever --workloads says): the same weights written
   as a checkpoint and served by `python -m kernel.supervisor` with the engine's settings; d's
   requests from as many streaming clients at once (target: >= 0.95 of the in-process tokens/s), e's
   one at a time (target: TTFT p50 at most 3 ms above in-process), twice: with text, then token ids
   alone (`detokenize` false: no tokenizer on the way back), then for each --concurrency
   level max(8, 2 x level) new requests of d's lengths from that many clients in a closed loop.
   --plot draws the sweep (needs matplotlib; else `python -m ops.bench.plot out.json --out out.png`).
"""

import argparse
import importlib.util
import tempfile
from pathlib import Path

import numpy as np

from ops.bench.feature_cost import FEATURES, measure_deterministic_cost, measure_feature_cost
from ops.bench.inprocess import InProcessBench
from ops.bench.report import Report, run_identity
from ops.bench.requests import BenchRequest, Sampling, random_requests
from ops.bench.shapes import SHAPES
from ops.bench.testbed import Testbed

WORKLOADS = ("a", "b", "c", "d", "e")
WARM_UP_REQUESTS = 8
WARM_UP_OUTPUT_TOKENS = 16


def token_range(text: str) -> tuple[int, int]:
    low, high = (int(n) for n in text.split(","))
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"want LOW,HIGH with 1 <= LOW <= HIGH, got {text!r}")
    return low, high


def levels(text: str) -> list[int]:
    found = [int(n) for n in text.split(",") if n]
    if any(n < 1 for n in found):
        raise argparse.ArgumentTypeError(f"concurrency levels must be positive, got {text!r}")
    return found


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--mode", default="inprocess", choices=("inprocess", "http"))
    parser.add_argument("--workloads", default="a,b,c,d")
    parser.add_argument("--requests", type=int, default=256, help="requests of workload d")
    parser.add_argument(
        "--lengths",
        type=token_range,
        default=(100, 1024),
        help="LOW,HIGH: prompt and output lengths of d and the sweep",
    )
    parser.add_argument(
        "--hf-requests", type=int, default=None, help="of those, run through transformers (default: all; 0: skip)"
    )
    parser.add_argument("--decode-batch", type=int, default=256, help="batch of workload b")
    parser.add_argument("--context", type=int, default=1024, help="context of workloads a and b")
    parser.add_argument("--low-load-requests", type=int, default=40, help="requests of workload e")
    parser.add_argument("--low-load-prompt", type=int, default=500, help="prompt tokens of each request of e")
    parser.add_argument("--low-load-output", type=int, default=16, help="output tokens of each request of e")
    parser.add_argument(
        "--concurrency",
        type=levels,
        default=[1, 4, 16, 64, 256],
        help="levels of the HTTP sweep (--mode http; empty: no sweep)",
    )
    parser.add_argument(
        "--sweep-requests", type=int, default=None, help="requests per level (default: max(8, 2 x level))"
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="write (or reuse) --mode http's checkpoint here and keep it (default: a temporary one)",
    )
    parser.add_argument("--kv-cache-gb", type=float, default=None)
    parser.add_argument(
        "--attention-backend",
        default="auto",
        choices=("auto", "flashinfer", "triton", "torch"),
        help="of the in-process runner and (--mode http) of the server's executor",
    )
    parser.add_argument("--seed", type=int, default=0)
    drawing = parser.add_argument_group("how every request draws its tokens (default: greedy)")
    drawing.add_argument("--temperature", type=float, default=0.0)
    drawing.add_argument("--top-p", type=float, default=1.0)
    drawing.add_argument("--top-k", type=int, default=0, help="0 or -1: off")
    drawing.add_argument("--min-p", type=float, default=0.0, help="0: off")
    parser.add_argument("--json", default=None, help="also write the details here")
    parser.add_argument("--plot", default=None, help="a PNG of the HTTP sweep (needs matplotlib)")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the in-process engine's steps in workloads a and b"
    )
    parser.add_argument(
        "--feature-cost",
        default="",
        help="comma-separated features (logprobs, rules, json_schema) whose cost on workloads a and d to measure; "
        "runs a and d",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="workloads a and d again with --deterministic's batch-invariant kernels, beside the default run",
    )
    parser.add_argument("--kernel-profile", action="store_true", help="GPU time per kernel of a decode step")
    parser.add_argument("--hf-diagnose", type=int, default=0, help="time transformers' decode step at this batch")
    args = parser.parse_args()
    args.workloads = set(args.workloads.split(","))
    args.feature_cost = [f for f in args.feature_cost.split(",") if f]
    for feature in args.feature_cost:
        if feature not in FEATURES:
            parser.error(f"unknown feature {feature!r} for --feature-cost; choose from {','.join(FEATURES)}")
    if args.deterministic and args.attention_backend != "auto":
        parser.error("--deterministic attends with its own batch-invariant kernels: leave --attention-backend at auto")
    if args.feature_cost or args.deterministic:
        args.workloads |= {"a", "d"}  # the runs without the features
    if not (0 <= args.temperature <= 2 and 0 < args.top_p <= 1 and args.top_k >= -1 and 0 <= args.min_p <= 1):
        parser.error(
            "sampling as the server accepts it: --temperature in [0, 2], --top-p in (0, 1], "
            "--top-k -1 or more, --min-p in [0, 1]"
        )
    args.sampling = Sampling(args.temperature, args.top_p, args.top_k, args.min_p)
    unknown = args.workloads - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {','.join(WORKLOADS)}")
    if args.hf_requests is not None and args.hf_requests < 0:
        parser.error("--hf-requests must be 0 (skip) or more")
    if args.mode == "http":
        args.workloads |= {"d", "e"}  # the in-process twins of the HTTP figures
    if args.plot and args.mode != "http":
        parser.error("--plot draws the HTTP sweep: give --mode http")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(
            f"matplotlib is absent: no {args.plot} from this run; make it elsewhere from --json's file with "
            f"python -m ops.bench.plot RESULTS.json --out {args.plot}",
            flush=True,
        )
        args.plot = None
    return args


def main() -> None:
    args = parse_args()
    workloads = args.workloads
    report = Report()
    testbed = Testbed(args, report)
    details = report.details
    details.run = run_identity(args.model, testbed.device_name)
    testbed.measure_ceilings()
    testbed.build_runner()
    bench = InProcessBench(testbed)
    if "a" in workloads:
        details.a = bench.decode("a", 1, args.context, 129, "<= 6.0 ms (8B)")
        if args.kernel_profile and testbed.device.type == "cuda":
            from ops.bench.kernel_profile import kernel_profile

            print(kernel_profile(testbed.runner, args.context), flush=True)
    if "b" in workloads:
        details.b = bench.decode("b", args.decode_batch, args.context, 96, "<= 1.25x")
    if "c" in workloads:
        details.c = bench.prefill("c", 2048, 16)
    if args.hf_diagnose:
        bench.diagnose_hf(args.hf_diagnose)
    warm = offline = low_load = None
    vocab = testbed.config.vocab_size
    if workloads & {"d", "e"}:
        rng = np.random.default_rng(args.seed + 4)
        warm = random_requests(rng, rng, vocab, WARM_UP_REQUESTS, args.lengths, (WARM_UP_OUTPUT_TOKENS,) * 2)
        bench.warm_up(warm)
    if "e" in workloads:
        rng = np.random.default_rng(args.seed + 3)
        low_load = random_requests(
            rng, rng, vocab, args.low_load_requests, (args.low_load_prompt,) * 2, (args.low_load_output,) * 2
        )
        details.e = bench.low_load("e", low_load)
    if "d" in workloads:
        offline = bench.offline_requests(args.requests, args.lengths)
        details.d = bench.throughput("d", offline)
    if args.feature_cost:
        details.feature_cost = [
            measure_feature_cost(testbed, feature, args.context, details.a, details.d, offline)
            for feature in args.feature_cost
        ]
    if args.deterministic:
        cost = measure_deterministic_cost(testbed, args.context, details.a, details.d, warm, offline)
        details.feature_cost = [*(details.feature_cost or []), cost]
    if "d" in workloads and args.hf_requests != 0:
        details.d_hf = bench.hf_baseline("d", details.d, offline[: args.hf_requests])
    try:
        if args.mode == "http":
            run_system(testbed, report, args, warm, low_load, offline)
    finally:  # the in-process figures are kept even when the whole system fails
        report.print_table()
        if args.json:
            report.write_json(args.json)
    if args.plot:
        from ops.bench.plot import plot_sweep

        plot_sweep(report.as_json(), args.plot)
        print(f"plot: {args.plot}")


def run_system(
    testbed: Testbed,
    report: Report,
    args: argparse.Namespace,
    warm: list[BenchRequest],
    low_load: list[BenchRequest],
    offline: list[BenchRequest],
) -> None:
    import uvloop

    from ops.bench.system import SystemBench

    with tempfile.TemporaryDirectory(prefix="bench-system-") as work:
        system = SystemBench(testbed, report, Path(work), args.checkpoint_dir)
        try:
            system.start()
            uvloop.run(
                system.measure(
                    warm, low_load, report.details.e, offline, report.details.d, args.concurrency, args.sweep_requests
                )
            )
        finally:
            system.stop()


if __name__ == "__main__":
    main()
