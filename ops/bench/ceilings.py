"""The two ceilings a benchmark is judged against, measured on the device in the same run: memory
bandwidth (a large device-to-device copy, bytes read plus written) and bf16 matrix-product rate.
"""

import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of `fn`, with device events on CUDA (no host clock in the loop)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, size_bytes: int = 2 << 30) -> float:
    """Bytes per second of a device-to-device copy, counting the read and the write."""
    src = torch.randn(size_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device)
    return 2 * size_bytes / seconds


def gemm_flops(device: torch.device, n: int = 8192, dtype: torch.dtype = torch.bfloat16) -> float:
    """FLOP/s of an n x n x n matrix product, rotating over three input pairs so no pair sits in cache."""
    gen = torch.Generator(device=device).manual_seed(0)
    pairs = [
        (
            torch.randn(n, n, device=device, dtype=dtype, generator=gen),
            torch.randn(n, n, device=device, dtype=dtype, generator=gen),
        )
        for _ in range(3)
    ]
    out = torch.empty(n, n, device=device, dtype=dtype)
    turn = iter(range(1 << 30))

    def one() -> None:
        a, b = pairs[next(turn) % len(pairs)]
        torch.matmul(a, b, out=out)

    return 2 * n**3 / median_seconds(one, device)
