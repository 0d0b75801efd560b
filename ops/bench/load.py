"""Weight loading against the disk's speed. Writes a random-weight checkpoint of a named real shape
(once; it stays in --dir), then, each pass:
- drops the files from the page cache and reads them start to end (the disk's sequential read
  rate: the reference);
- drops them again and times `gpu.weights.load_model` onto the GPU, the executor's start-up path
  (reading, copying, and packing q/k/v and gate/up into one product each);
- times the same load with the files in the page cache, against the host-to-device copy rate.

    python -m ops.bench.load --model llama-3.1-8b --dir /tmp/bench-load
"""

import argparse
import time
from pathlib import Path

import torch

from gpu.config import ModelConfig
from gpu.weights import checkpoint_files, load_model, random_model
from ops.bench.ceilings import median_seconds
from ops.bench.checkpoint import write_checkpoint
from ops.bench.disk_reads import drop_from_page_cache, read_seconds
from ops.bench.records import Row
from ops.bench.report import Report
from ops.bench.shapes import SHAPES

GB = 1e9


def load_seconds(model_dir: Path, config: ModelConfig, device: torch.device) -> float:
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    model = load_model(model_dir, config, device, torch.bfloat16)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    del model
    torch.cuda.empty_cache()
    return seconds


def host_to_device_rate(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes per second of one large copy from pinned host memory."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return nbytes / median_seconds(lambda: target.copy_(host, non_blocking=True), device, repeats=5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument(
        "--dir",
        type=Path,
        required=True,
        help="where the checkpoint is written and kept (16 GB for llama-3.1-8b), on the disk to measure",
    )
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("loading onto the GPU needs CUDA")
    device = torch.device("cuda")
    raw = SHAPES[args.model]
    config = ModelConfig.from_dict(raw)
    model_dir = args.dir / args.model
    model = random_model(config, device, torch.bfloat16, seed=args.seed)
    written_s = write_checkpoint(model, raw, model_dir, {"model": args.model, "seed": args.seed})
    del model
    torch.cuda.empty_cache()
    files = checkpoint_files(model_dir)
    nbytes = sum(f.stat().st_size for f in files)

    report = Report()
    report.note(
        f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; model {args.model}, "
        f"bf16, {len(files)} safetensors files, {nbytes / GB:.2f} GB in {model_dir} "
        f"(written in {written_s:.1f} s; 0 = already there)"
    )
    copy_rate = host_to_device_rate(device)
    for n in range(1, args.passes + 1):
        drop_from_page_cache(files)
        disk_rate = nbytes / read_seconds(files)
        drop_from_page_cache(files)
        cold_s = load_seconds(model_dir, config, device)
        report.add(
            Row(
                f"pass {n}: load from disk",
                f"{cold_s:.2f} s, {nbytes / cold_s / GB:.2f} GB/s",
                f"sequential read {disk_rate / GB:.2f} GB/s",
                f"{nbytes / cold_s / disk_rate:.2f}",
                "at disk speed",
            )
        )
        warm_s = load_seconds(model_dir, config, device)
        report.add(
            Row(
                f"pass {n}: load from page cache",
                f"{warm_s:.2f} s, {nbytes / warm_s / GB:.2f} GB/s",
                f"pinned host-to-device copy {copy_rate / GB:.2f} GB/s",
                f"{nbytes / warm_s / copy_rate:.2f}",
            )
        )
    report.print_table()


if __name__ == "__main__":
    main()
