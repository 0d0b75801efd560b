"""The sampler alone on the GPU: `gpu/sampler_kernel.py` against the torch path it replaces there,
and against reading the logits once at the copy rate measured in the same run.

    python -m ops.bench.sampler --model llama-3.1-8b

Each setting runs at batch sizes 1, 4, 16, 64 and 256 over float32 logits of the model's vocabulary,
of two kinds: flat (N(0, 0.5^2) per token, as a random-weight model gives: top-k keeps few of many nearly
equal tokens, the kernel's hardest case) and peaked (N(0, 10^2): a few tokens hold most of the mass,
as in a trained model). GPU time is measured behind a GPU sleep, so that the host's launches are
queued ahead and only the device's work counts, as in a decode step whose sampling is launched
while the model runs; host time is the launch's own.
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from gpu.sampler import SamplingTensors, sample
from gpu.sampler_kernel import sample_on_gpu
from ops.bench.ceilings import copy_bandwidth
from ops.bench.records import Row
from ops.bench.report import Report
from ops.bench.shapes import SHAPES

SETTINGS = {  # name: (temperature, top_p, top_k, min_p)
    "temperature 1": (1.0, 1.0, 0, 0.0),
    "top-p 0.95": (1.0, 0.95, 0, 0.0),
    "top-k 50": (1.0, 1.0, 50, 0.0),
    "top-k 20 + top-p 0.8, temperature 0.7": (0.7, 0.8, 20, 0.0),
    "min-p 0.05": (1.0, 1.0, 0, 0.05),
}
LOGITS = {"flat": 0.5, "peaked": 10.0}  # the standard deviation of each token's logit
BATCHES = (1, 4, 16, 64, 256)
SLEEP_CYCLES = 50_000_000  # about 25 ms of GPU clock: longer than any launch here takes on the host


def gpu_and_host_seconds(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Medians over `repeats` calls of `fn`: GPU seconds per call, with every call enqueued behind a
    GPU sleep (no gaps from the host), and host seconds to enqueue one call."""
    fn()  # compiles and warms up
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        began = time.perf_counter()
        fn()
        host.append(time.perf_counter() - began)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) / 1e3)
    return statistics.median(gpu), statistics.median(host)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda")
    vocab = SHAPES[args.model]["vocab_size"]
    copy_rate = copy_bandwidth(device)
    report = Report()
    report.note(
        f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; "
        f"{args.model}'s vocabulary of {vocab:,} tokens; float32 logits; copy rate {copy_rate / 1e12:.3f} TB/s"
    )
    report.note(
        "measured: the kernel's GPU ms (host ms to launch it); bound: the torch path's GPU ms, then the "
        "logits read once at the copy rate"
    )
    generator = torch.Generator(device=device).manual_seed(0)
    for kind, spread in LOGITS.items():
        for batch in BATCHES:
            logits = torch.randn(batch, vocab, device=device, generator=generator) * spread
            bound = logits.numel() * logits.element_size() / copy_rate
            for name, (temperature, top_p, top_k, min_p) in SETTINGS.items():
                params = SamplingTensors.from_lists(
                    [temperature] * batch,
                    [top_p] * batch,
                    [top_k] * batch,
                    [min_p] * batch,
                    list(range(batch)),
                    [7] * batch,
                    device,
                )
                kernel, kernel_host = gpu_and_host_seconds(lambda: sample_on_gpu(logits, params), args.repeats)
                torch_path, _ = gpu_and_host_seconds(lambda: sample(logits, params), args.repeats)
                report.add(
                    Row(
                        f"{kind}, batch {batch}, {name}",
                        f"{kernel * 1e3:.3f} ms ({kernel_host * 1e3:.3f} ms host)",
                        f"torch {torch_path * 1e3:.3f} ms; read {bound * 1e3:.3f} ms",
                        f"torch / kernel {torch_path / kernel:.1f}x; kernel / read {kernel / bound:.1f}x",
                        "",
                    )
                )
    report.print_table()


if __name__ == "__main__":
    main()
