"""KV blocks from the GPU to the host tier and back on real scattered block sets (issue 34's first
"Must show"): a KV pool of a real model's shape (llama-3.1-8b: 32 layers, 8 KV heads, head_dim 128,
bf16, blocks of 16 tokens: 2 MiB a block) and host slots in a shared-memory segment
(actors/cache_tier/host_segment.py), copied by gpu/kv_transfer.py. Each of `--transfers` rounds
saves `--blocks` random pool blocks to random slots and loads them back into other random blocks;
each direction's GB/s against one large pinned copy of the same bytes between the same host memory
and the device, measured in the same run. Target: >= 45 GB/s per direction. The blocks loaded back
must equal those saved. `--json` writes the figures (records.KvTierCopyFigures).

    python -m ops.bench.kv_tier_copy --model llama-3.1-8b --json docs/results/kv-tier-copy-llama-3.1-8b.json
    python -m ops.bench.kv_tier_copy --model toy-llama --device cpu --pool-blocks 64 --host-slots 32 --blocks 16

The segment needs `--host-slots` blocks of room in /dev/shm; `--host-memory pinned` takes torch's
pinned memory instead where /dev/shm is small (a container's default is 64 MiB).
"""

import argparse
import os
import statistics
import time

import numpy as np
import torch

from actors.cache_tier.host_segment import HostSegment
from gpu.kv_cache import KVCache
from gpu.kv_transfer import KVTransfer
from ops.bench.records import KvTierCopyFigures, Row
from ops.bench.report import Report, run_identity
from ops.bench.shapes import SHAPES

TARGET_GB_S = 45.0
GB = 1e9
MiB = 1 << 20


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(work, device: torch.device) -> float:
    """How long `work()` takes until the device has done all it queued."""
    synchronize(device)
    started = time.perf_counter()
    work()
    synchronize(device)
    return time.perf_counter() - started


def ceiling(host: torch.Tensor, device: torch.device, repeats: int) -> tuple[float, float]:
    """GB/s of one copy of `host` (a flat pinned range) to the device and of one back: the median of
    `repeats` each, (device to host, host to device)."""
    on_device = torch.empty_like(host, device=device)
    to_host = [seconds(lambda: host.copy_(on_device, non_blocking=True), device) for _ in range(repeats)]
    to_device = [seconds(lambda: on_device.copy_(host, non_blocking=True), device) for _ in range(repeats)]
    return host.numel() / statistics.median(to_host) / GB, host.numel() / statistics.median(to_device) / GB


def rounds(kv: KVCache, transfer: KVTransfer, args, rng: np.random.Generator) -> tuple[list, list, bool]:
    """`args.transfers` saves and loads of scattered block sets, after one untimed; GB/s of each
    save and load, and whether every set came back the same."""
    transfer_bytes = sum(layer[0].nbytes for layer in kv.layers) * args.blocks
    device = kv.layers[0].device
    saves, loads, same = [], [], True
    for round_ in range(args.transfers + 1):
        chosen = rng.choice(kv.num_blocks, 2 * args.blocks, replace=False).tolist()
        sources, targets = chosen[: args.blocks], chosen[args.blocks :]
        slots = rng.choice(transfer.num_slots, args.blocks, replace=False).tolist()
        save_s = seconds(lambda: transfer.save(sources, slots).wait(), device)
        load_s = seconds(lambda: (transfer.load(slots, targets), kv.arrivals.settle()), device)
        same = same and all(torch.equal(layer[sources], layer[targets]) for layer in kv.layers)
        if round_ > 0:  # the first warms up: the staging buffers' first touch, the pinned index memory
            saves.append(transfer_bytes / save_s / GB)
            loads.append(transfer_bytes / load_s / GB)
    return saves, loads, same


def host_slots(args, block_bytes: int, device: torch.device) -> tuple[torch.Tensor, HostSegment | None]:
    if args.host_memory == "pinned":
        pinned = device.type == "cuda"
        return torch.empty(args.host_slots, block_bytes, dtype=torch.uint8, pin_memory=pinned), None
    segment = HostSegment.create(f"kv-tier-copy-{os.getpid()}", args.host_slots, block_bytes)
    return torch.from_numpy(segment.slots()), segment


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.kv_tier_copy", description=__doc__)
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--pool-blocks", type=int, default=4096)
    parser.add_argument("--host-slots", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=512, help="blocks per transfer")
    parser.add_argument("--transfers", type=int, default=10)
    parser.add_argument("--host-memory", default="segment", choices=["segment", "pinned"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.pool_blocks < 2 * args.blocks or args.host_slots < args.blocks:
        parser.error("--pool-blocks must be at least twice --blocks, and --host-slots at least --blocks")
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = Report()
    report.details.run = run_identity(args.model, device_name, "ops.bench.kv_tier_copy")
    shape = SHAPES[args.model]
    layers, heads, head_dim = shape["num_hidden_layers"], shape["num_key_value_heads"], shape["head_dim"]
    dtype = getattr(torch, args.dtype)
    block_bytes = KVCache.bytes_per_block(layers, args.block_size, heads, head_dim, dtype)
    kv = KVCache(layers, args.pool_blocks, args.block_size, heads, head_dim, dtype, device)
    generator = torch.Generator(device).manual_seed(args.seed)
    for layer in kv.layers:  # random, so a block in the wrong place shows
        layer.normal_(generator=generator)
    slots, segment = host_slots(args, block_bytes, device)
    report.note(
        f"device: {device_name}; torch {torch.__version__}; {args.model} KV shape: {layers} layers, {heads} KV heads, "
        f"head_dim {head_dim}, {args.dtype}, blocks of {args.block_size} tokens ({block_bytes / MiB:.2f} MiB a block)"
    )
    report.note(
        f"pool of {args.pool_blocks} blocks; {args.host_slots} host slots ({args.host_memory}); "
        f"{args.transfers} transfers each way of {args.blocks} random scattered blocks to random slots"
    )
    try:
        transfer = KVTransfer(kv, slots)  # pins the host slots
        saves, loads, same = rounds(kv, transfer, args, np.random.default_rng(args.seed))
        span = torch.as_strided(slots, (args.blocks * block_bytes,), (1,))  # as many bytes from the first slot on
        ceiling_save, ceiling_load = ceiling(span, device, args.transfers)
        transfer.close()
    finally:
        if segment is not None:
            segment.close()
            segment.unlink()
    figures = KvTierCopyFigures(
        block_bytes=block_bytes,
        blocks=args.blocks,
        pool_blocks=args.pool_blocks,
        host_slots=args.host_slots,
        host_memory=args.host_memory,
        save_gb_s=statistics.median(saves),
        load_gb_s=statistics.median(loads),
        saves_gb_s=saves,
        loads_gb_s=loads,
        ceiling_save_gb_s=ceiling_save,
        ceiling_load_gb_s=ceiling_load,
        same_blocks=same,
    )
    add_rows(report, figures)
    report.details.kv_tier_copy = figures
    report.print_table()
    if args.json:
        report.write_json(args.json)


def add_rows(report: Report, f: KvTierCopyFigures) -> None:
    size = f"{f.blocks} scattered blocks of {f.block_bytes / MiB:.2f} MiB"
    for direction, rate, rates, bound in (
        ("GPU to host (save)", f.save_gb_s, f.saves_gb_s, f.ceiling_save_gb_s),
        ("host to GPU (load)", f.load_gb_s, f.loads_gb_s, f.ceiling_load_gb_s),
    ):
        report.add(
            Row(
                f"{direction}: {size}",
                f"{rate:.1f} GB/s (min {min(rates):.1f})",
                f"one pinned copy of the same bytes: {bound:.1f} GB/s",
                f"{rate / bound:.2f}",
                f">= {TARGET_GB_S:.0f} GB/s",
            )
        )
    report.add(Row("blocks loaded back equal those saved", "same" if f.same_blocks else "DIFFERENT", "", "", "same"))


if __name__ == "__main__":
    main()
