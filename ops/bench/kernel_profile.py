"""Where a decode step's GPU time goes, for the benchmark's --kernel-profile."""

import torch

from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput


def kernel_profile(runner: ModelRunner, context: int, steps: int = 5) -> str:
    """GPU time per kernel of eager batch-1 decode steps at `context` (a CUDA graph replays the same
    kernels; its time minus their sum is launch gaps). Writes KV into the first blocks of the pool."""
    blocks = list(range(-(-context // runner.block_size)))
    forward = runner.eager_forward([SequenceInput([1], context - 1, blocks, sample=True)])
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    for _ in range(3):
        forward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            forward()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60)
    return f"-- kernels of one eager batch-1 decode step ({steps} steps profiled)\n{table}"
