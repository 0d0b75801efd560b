"""Batch-1 decode's matrix products, cuBLAS (F.linear) against our GEMV (gpu/gemv.py), on a real shape.

Each product runs as a decode step runs it: replayed from a CUDA graph (no launch cost), over as
many copies of the weight as the model has layers, so it reads its weights from HBM, not L2. The
reference is the device-to-device copy rate measured in the same run.

    python -m ops.bench.gemv --model llama-3.1-8b [--sweep]

`--sweep` also times every kernel configuration of a grid on each product and prints the fastest,
which is how `gpu.gemv.gemv_config` was chosen.
"""

import argparse
import itertools

import torch
import torch.nn.functional as F

from gpu.config import ModelConfig
from gpu.gemv import gemv, gemv_config, launch_gemv
from ops.bench.ceilings import copy_bandwidth
from ops.bench.shapes import SHAPES


def products(config: ModelConfig) -> dict[str, tuple[int, int, int]]:
    """name -> (rows N, columns K, how many per step) of one decode step's products."""
    c, layers = config, config.num_hidden_layers
    heads = c.num_attention_heads * c.head_dim
    return {
        "qkv": (heads + 2 * c.num_key_value_heads * c.head_dim, c.hidden_size, layers),
        "o": (c.hidden_size, heads, layers),
        "gate_up": (2 * c.intermediate_size, c.hidden_size, layers),
        "down (silu fused in ours)": (c.hidden_size, c.intermediate_size, layers),
        "lm_head": (c.vocab_size, c.hidden_size, 1),
    }


def graph_time_s(run_all, replays: int = 20) -> float:
    """Seconds per replay of a graph of `run_all`."""
    run_all()  # compiles and warms up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_all()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / replays


SWEEP = list(itertools.product((1, 2, 4, 8), (512, 1024, 2048), (4, 8), (2, 3, 4)))


def sweep(
    name: str, x: torch.Tensor, weights: list[torch.Tensor], fused: bool, weight_bytes: int, bandwidth: float
) -> None:
    """Prints the fastest configurations of the grid for this product, and where the default stands."""
    y = torch.empty(1, weights[0].shape[0], device=x.device, dtype=x.dtype)
    timed = []
    for config in SWEEP:
        seconds = graph_time_s(lambda: [launch_gemv(x, w, None, y, fused, *config) for w in weights], replays=5)
        timed.append((seconds / len(weights), config))
    timed.sort()
    default = gemv_config(*weights[0].shape)
    rank = [config for _, config in timed].index(default) if default in SWEEP else -1
    best = ", ".join(f"{c} {weight_bytes / s / bandwidth:.2f}" for s, c in timed[:3])
    print(f"  sweep {name}: best (rows, cols, warps, stages) ours/copy: {best}; default {default} ranks {rank + 1}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--sweep", action="store_true", help="also time a grid of kernel configurations")
    args = parser.parse_args()
    device = torch.device("cuda")
    config = ModelConfig.from_dict(SHAPES[args.model])
    bandwidth = copy_bandwidth(device)
    print(
        f"{torch.cuda.get_device_name(device)}, {args.model}, bf16, batch 1; "
        f"device copy (read + write) {bandwidth / 1e12:.3f} TB/s"
    )
    print(
        f"{'product':26s} {'N x K':>14s} {'count':>5s} | {'cuBLAS us':>9s} {'TB/s':>6s} | {'ours us':>8s} {'TB/s':>6s} | ours/copy"
    )
    totals = [0.0, 0.0, 0]
    for name, (rows, cols, count) in products(config).items():
        fused = name.startswith("down")
        weights = [torch.randn(rows, cols, device=device, dtype=torch.bfloat16) * cols**-0.5 for _ in range(count)]
        x = torch.randn(1, 2 * cols if fused else cols, device=device, dtype=torch.bfloat16)
        if fused:
            from gpu.kernels import silu_and_mul

            reference = lambda: [F.linear(silu_and_mul(x), w) for w in weights]  # noqa: E731
        else:
            reference = lambda: [F.linear(x, w) for w in weights]  # noqa: E731
        cublas_s = graph_time_s(reference) / count
        ours_s = graph_time_s(lambda: [gemv(x, w, silu_mul=fused) for w in weights]) / count
        weight_bytes = rows * cols * 2
        if args.sweep:
            sweep(name, x, weights, fused, weight_bytes, bandwidth)
        print(
            f"{name:26s} {rows:>6d} x {cols:<6d} {count:>5d} | {cublas_s * 1e6:9.1f} {weight_bytes / cublas_s / 1e12:6.3f} "
            f"| {ours_s * 1e6:8.1f} {weight_bytes / ours_s / 1e12:6.3f} | {weight_bytes / ours_s / bandwidth:.2f}"
        )
        totals[0] += cublas_s * count
        totals[1] += ours_s * count
        totals[2] += weight_bytes * count
        weights.clear()  # frees this product's copies before the next one's are made
    cublas_s, ours_s, total_bytes = totals
    print(
        f"one step's products, {total_bytes / 1e9:.2f} GB: cuBLAS {cublas_s * 1e3:.3f} ms "
        f"({total_bytes / cublas_s / 1e12:.3f} TB/s), ours {ours_s * 1e3:.3f} ms ({total_bytes / ours_s / 1e12:.3f} TB/s), "
        f"bound at the copy rate {total_bytes / bandwidth * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
