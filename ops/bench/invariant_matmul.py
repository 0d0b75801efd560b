"""`--deterministic`'s matrix products (gpu/invariant/matmul.py) against the default ones (our GEMV
at one row, cuBLAS beyond), on a real shape's weights, at the row counts that matter: 1 (batch-1
decode), 16, 256 (a large decode batch) and 4096 (a prefill step). Products replay from CUDA
graphs; at up to 256 rows over as many copies of the weight as the model has layers, so they read
it from HBM, not L2.

    python -m ops.bench.invariant_matmul --model llama-3.1-8b [--sweep]

`--sweep` also times a grid of tile configurations (pointer and TMA kernels) on each product and prints the best few by the
sum of their times at 1 and at 4096 rows, each row count's time beside the default's: what
`gpu.invariant.matmul.config_for` is chosen from. The grid keeps each weight's K step, which alone
fixes the bits; the tile may differ between a decode batch and a prefill.
"""

import argparse
import itertools

import torch

from gpu.config import ModelConfig
from gpu.gemv import linear
from gpu.invariant.matmul import MatmulConfig, block_k_for, config_for, matmul
from ops.bench.gemv import graph_time_s
from ops.bench.shapes import SHAPES

ROWS = (1, 16, 256, 4096)
SHARED_MEMORY_BYTES = 227 * 1024  # an H100's or H200's per block


def sweep(block_k: int) -> list[MatmulConfig]:
    """Tiles around one K step: of one warp group's rows (4 warps) or two (8); by pointer loads, or
    by TMA loads with and without warp specialization (the epilogue's tile in shared memory too)."""
    grid = []
    for m, n, stages, (tma, specialized) in itertools.product(
        (64, 128), (32, 64, 128, 256), (3, 4, 5), ((False, False), (True, False), (True, True))
    ):
        epilogue = m * n * 2 if tma else 0
        if stages * (m + n) * block_k * 2 + epilogue <= SHARED_MEMORY_BYTES and (m, n) != (64, 256):
            grid.append(MatmulConfig(m, n, block_k, 8, m // 16, stages, tma, specialized))
    return grid


def products(config: ModelConfig) -> dict[str, tuple[int, int, int]]:
    """name -> (N, K, count per step) of a step's products."""
    c = config
    heads = c.num_attention_heads * c.head_dim
    layers = c.num_hidden_layers
    return {
        "qkv": (heads + 2 * c.num_key_value_heads * c.head_dim, c.hidden_size, layers),
        "o": (c.hidden_size, heads, layers),
        "gate_up": (2 * c.intermediate_size, c.hidden_size, layers),
        "down": (c.hidden_size, c.intermediate_size, layers),
        "lm_head": (c.vocab_size, c.hidden_size, 1),
    }


def time_per_product(product, weights: list[torch.Tensor], rows: int) -> float:
    """Seconds of one product of `rows` rows, over the copies (one copy above 256 rows: compute-bound)."""
    used = weights if rows <= 256 else weights[:1]
    x = torch.randn(rows, weights[0].shape[1], device=weights[0].device, dtype=weights[0].dtype)
    return graph_time_s(lambda: [product(x, w) for w in used], replays=5 if rows > 256 else 20) / len(used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--sweep", action="store_true", help="also time a grid of tile configurations")
    args = parser.parse_args()
    device = torch.device("cuda")
    config = ModelConfig.from_dict(SHAPES[args.model])
    print(f"{torch.cuda.get_device_name(device)}, {args.model}, bf16; microseconds per product, ours / default")
    print(
        f"{'product':8s} {'N x K':>14s} config (m, n, k, group, warps, stages) | "
        + " | ".join(f"{r:>19d}" for r in ROWS)
    )
    totals = {r: [0.0, 0.0] for r in ROWS}
    for name, (n_cols, k_cols, count) in products(config).items():
        weights = [
            torch.randn(n_cols, k_cols, device=device, dtype=torch.bfloat16) * k_cols**-0.5 for _ in range(count)
        ]
        default = {r: time_per_product(linear, weights, r) for r in ROWS}
        ours = {r: time_per_product(matmul, weights, r) for r in ROWS}
        for r in ROWS:
            totals[r][0] += ours[r] * count
            totals[r][1] += default[r] * count
        cells = " | ".join(f"{ours[r] * 1e6:8.1f} / {default[r] * 1e6:8.1f}" for r in ROWS)
        tiles = [tuple(config_for(n_cols, k_cols, torch.bfloat16, r)) for r in (1, 4096)]
        print(f"{name:8s} {n_cols:>6d} x {k_cols:<6d} {tiles[0]}, {tiles[1]} | {cells}")
        if args.sweep:
            timed = []
            for candidate in sweep(block_k_for(n_cols, k_cols, torch.bfloat16)):
                product = lambda x, w, c=candidate: matmul(x, w, config=c)  # noqa: E731
                times = {r: time_per_product(product, weights, r) for r in ROWS}
                timed.append((times[1] + times[4096], candidate, times))
            for _, candidate, times in sorted(timed)[:4]:
                cells = " | ".join(f"{times[r] * 1e6:8.1f} / {default[r] * 1e6:8.1f}" for r in ROWS)
                print(f"  sweep {tuple(candidate)} | {cells}")
        weights.clear()  # frees this product's copies before the next one's are made
    print(
        "a step's products, ms, ours / default: "
        + ", ".join(f"{r} rows {o * 1e3:.3f} / {d * 1e3:.3f}" for r, (o, d) in totals.items())
    )


if __name__ == "__main__":
    main()
